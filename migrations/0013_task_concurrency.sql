-- TASK node concurrency keys (issue 17, decision 0020 "Task slots").
--
-- A TASK node may say `concurrency: {key, max}`: at most `max` of its tasks
-- hold a slot per (namespace, workflow name, node id, key value) at a time.
-- A task holds a slot while it is DISPATCHED, LEASED or HELD. One that
-- finds the key full waits WAITING_SLOT (no outbox row, not leasable), in
-- order of arrival, and is handed a slot by the transaction that frees one.
--
-- Both ends are triggers on `tasks`, so no statement that arms, ends,
-- cancels, expires or deletes a task can forget them; their WHEN clauses
-- keep them off every row without a key (the hot path: no function call).

-- The slot a task's attempt asks for (all NULL: none), and its arrival.
ALTER TABLE tasks ADD COLUMN concurrency_node TEXT;
ALTER TABLE tasks ADD COLUMN concurrency_key TEXT;
ALTER TABLE tasks ADD COLUMN concurrency_max INTEGER;
ALTER TABLE tasks ADD COLUMN concurrency_seq BIGINT;

CREATE SEQUENCE task_slot_arrivals;

-- One row per key value ever used: what every admission and release of the
-- key locks first, so per key they happen one at a time on any server.
-- The count is not stored: it is the number of holding tasks, read under
-- this lock through tasks_slot_holders, so it can never drift.
CREATE TABLE task_slots (
    namespace TEXT NOT NULL,
    workflow_name TEXT NOT NULL,
    node_id TEXT NOT NULL,
    key_value TEXT NOT NULL,
    PRIMARY KEY (namespace, workflow_name, node_id, key_value)
);

CREATE INDEX tasks_slot_holders ON tasks (namespace, workflow_name, concurrency_node, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status IN ('DISPATCHED', 'LEASED', 'HELD');
CREATE INDEX tasks_slot_waiting ON tasks (namespace, workflow_name, concurrency_node, concurrency_key,
    concurrency_seq) WHERE status = 'WAITING_SLOT';

-- Locks the key's slot row (creating it on first use).
CREATE FUNCTION task_slot_lock(ns TEXT, wf TEXT, node TEXT, k TEXT) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO task_slots (namespace, workflow_name, node_id, key_value)
    VALUES (ns, wf, node, k)
    ON CONFLICT (namespace, workflow_name, node_id, key_value)
    DO UPDATE SET key_value = EXCLUDED.key_value;
END $$;

-- Tasks holding a slot of the key, but the attempt of (run, node_key)
-- itself (whose row is being re-armed or promoted). Volatile: it must see
-- the rows earlier rows of the calling statement armed.
CREATE FUNCTION task_slot_holders(ns TEXT, wf TEXT, node TEXT, k TEXT, own_run UUID, own_node TEXT)
RETURNS BIGINT LANGUAGE sql AS $$
    SELECT count(*) FROM tasks
    WHERE namespace = ns AND workflow_name = wf AND concurrency_node = node
      AND concurrency_key = k AND status IN ('DISPATCHED', 'LEASED', 'HELD')
      AND NOT (run_id = own_run AND node_key = own_node)
$$;

-- Hands the key's free slots to its oldest waiting tasks, in order of
-- arrival: DISPATCHED with an outbox row, or HELD if the run is paused. A
-- waiter whose row or run row another transaction holds right now is
-- skipped (waiting for either could deadlock: that transaction may be
-- waiting for this slot row); the recovery loop's sweep promotes it later.
-- The outbox row is dated back so any server's enqueuer sends it at once:
-- no committing server holds this message to publish.
CREATE FUNCTION task_slots_promote(ns TEXT, wf TEXT, node TEXT, k TEXT) RETURNS INTEGER
LANGUAGE plpgsql AS $$
DECLARE
    waiter RECORD;
    promoted INTEGER := 0;
    sent BOOLEAN := false;
BEGIN
    PERFORM task_slot_lock(ns, wf, node, k);
    -- normally one; more only when a new version raised `max`, and then at
    -- most 64 per transaction (later releases and the sweep do the rest)
    WHILE promoted < 64 LOOP
        SELECT t.id, t.run_id, t.node_key, t.concurrency_max, r.status = 'PAUSED' AS paused
        INTO waiter
        FROM tasks t JOIN runs r ON r.id = t.run_id
        WHERE t.namespace = ns AND t.workflow_name = wf AND t.concurrency_node = node
          AND t.concurrency_key = k AND t.status = 'WAITING_SLOT'
        ORDER BY t.concurrency_seq
        LIMIT 1
        FOR UPDATE OF t SKIP LOCKED
        FOR SHARE OF r SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        EXIT WHEN task_slot_holders(ns, wf, node, k, waiter.run_id, waiter.node_key)
            >= waiter.concurrency_max;
        UPDATE tasks SET status = CASE WHEN waiter.paused THEN 'HELD' ELSE 'DISPATCHED' END,
            dispatched_at = now(), updated_at = now()
        WHERE id = waiter.id;
        IF NOT waiter.paused THEN
            INSERT INTO outbox (namespace, queue, task_id, attempt, shard_key, priority, created_at)
            SELECT namespace, queue, id, attempt, run_id, priority, now() - interval '1 hour'
            FROM tasks WHERE id = waiter.id;
            sent := true;
        END IF;
        promoted := promoted + 1;
    END LOOP;
    IF sent THEN
        PERFORM pg_notify('composer_outbox', '');
    END IF;
    RETURN promoted;
END $$;

-- Admission: a task armed (inserted or re-armed DISPATCHED or HELD) with a
-- key takes a slot if one is free, else waits WAITING_SLOT with a new
-- arrival. An upsert fires the INSERT trigger before it finds the row
-- exists; the row's own attempt is left out of the count, so the decision
-- is the right one either way, and the UPDATE trigger only repeats it.
CREATE FUNCTION tasks_take_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
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

CREATE TRIGGER tasks_take_slot_on_insert BEFORE INSERT ON tasks
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND NEW.status IN ('DISPATCHED', 'HELD'))
    EXECUTE FUNCTION tasks_take_slot();

CREATE TRIGGER tasks_take_slot_on_update BEFORE UPDATE ON tasks
    FOR EACH ROW
    WHEN (NEW.concurrency_key IS NOT NULL AND NEW.status IN ('DISPATCHED', 'HELD')
      AND (OLD.status NOT IN ('DISPATCHED', 'LEASED', 'HELD')
        OR OLD.concurrency_key IS DISTINCT FROM NEW.concurrency_key
        OR OLD.concurrency_node IS DISTINCT FROM NEW.concurrency_node))
    EXECUTE FUNCTION tasks_take_slot();

-- Release: a task that held a slot and no longer does (completed, failed,
-- expired, cancelled, re-armed under another key, deleted) hands it on in
-- the same transaction.
CREATE FUNCTION tasks_free_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM task_slots_promote(OLD.namespace, OLD.workflow_name, OLD.concurrency_node,
        OLD.concurrency_key);
    RETURN NULL;
END $$;

CREATE TRIGGER tasks_free_slot_on_update AFTER UPDATE ON tasks
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status IN ('DISPATCHED', 'LEASED', 'HELD')
      AND (NEW.status NOT IN ('DISPATCHED', 'LEASED', 'HELD')
        OR OLD.concurrency_key IS DISTINCT FROM NEW.concurrency_key
        OR OLD.concurrency_node IS DISTINCT FROM NEW.concurrency_node))
    EXECUTE FUNCTION tasks_free_slot();

CREATE TRIGGER tasks_free_slot_on_delete AFTER DELETE ON tasks
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status IN ('DISPATCHED', 'LEASED', 'HELD'))
    EXECUTE FUNCTION tasks_free_slot();
