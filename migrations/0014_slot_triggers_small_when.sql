-- The task-slot triggers of 0013 had WHEN clauses over status lists and
-- OLD/NEW comparisons. Postgres parses and compiles a trigger's WHEN clause
-- once per statement that touches the table, for every statement, keyed
-- tasks or not: in the B1 benchmark (no task has a key) that was about 7 %
-- of Postgres's CPU (stringToNode under ExecBR/ARUpdateTriggers). The WHEN
-- clauses now test only whether the row has a key, a one-node expression;
-- the rest of each condition moved into the functions, which run for keyed
-- rows only. What the triggers decide is unchanged.

CREATE OR REPLACE FUNCTION tasks_take_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status NOT IN ('DISPATCHED', 'HELD') THEN
        RETURN NEW;
    END IF;
    -- an update that keeps holding the same key's slot takes none
    IF TG_OP = 'UPDATE' AND OLD.status IN ('DISPATCHED', 'LEASED', 'HELD')
        AND OLD.concurrency_key IS NOT DISTINCT FROM NEW.concurrency_key
        AND OLD.concurrency_node IS NOT DISTINCT FROM NEW.concurrency_node THEN
        RETURN NEW;
    END IF;
    PERFORM task_slot_lock(NEW.namespace, NEW.workflow_name, NEW.concurrency_node,
        NEW.concurrency_key);
    IF task_slot_holders(NEW.namespace, NEW.workflow_name, NEW.concurrency_node,
            NEW.concurrency_key, NEW.run_id, NEW.node_key) >= NEW.concurrency_max THEN
        IF TG_OP = 'INSERT' OR OLD.status <> 'WAITING_SLOT' THEN
            NEW.concurrency_seq := nextval('task_slot_arrivals');
        END IF;
        NEW.status := 'WAITING_SLOT';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION tasks_free_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status NOT IN ('DISPATCHED', 'LEASED', 'HELD') THEN
        RETURN NULL;
    END IF;
    -- an update that keeps holding the same key's slot frees none
    IF TG_OP = 'UPDATE' AND NEW.status IN ('DISPATCHED', 'LEASED', 'HELD')
        AND OLD.concurrency_key IS NOT DISTINCT FROM NEW.concurrency_key
        AND OLD.concurrency_node IS NOT DISTINCT FROM NEW.concurrency_node THEN
        RETURN NULL;
    END IF;
    PERFORM task_slots_promote(OLD.namespace, OLD.workflow_name, OLD.concurrency_node,
        OLD.concurrency_key);
    RETURN NULL;
END $$;

DROP TRIGGER tasks_take_slot_on_insert ON tasks;
CREATE TRIGGER tasks_take_slot_on_insert BEFORE INSERT ON tasks
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION tasks_take_slot();

DROP TRIGGER tasks_take_slot_on_update ON tasks;
CREATE TRIGGER tasks_take_slot_on_update BEFORE UPDATE ON tasks
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION tasks_take_slot();

DROP TRIGGER tasks_free_slot_on_update ON tasks;
CREATE TRIGGER tasks_free_slot_on_update AFTER UPDATE ON tasks
    FOR EACH ROW WHEN (OLD.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION tasks_free_slot();

DROP TRIGGER tasks_free_slot_on_delete ON tasks;
CREATE TRIGGER tasks_free_slot_on_delete AFTER DELETE ON tasks
    FOR EACH ROW WHEN (OLD.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION tasks_free_slot();
