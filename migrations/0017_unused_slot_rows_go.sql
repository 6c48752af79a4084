-- A concurrency key's slot row lives while the key is in use, no longer
-- (issue 34, decision 0037). Until now `concurrency_slots` (run keys) and
-- `task_slots` (TASK node keys) kept a row per key value ever used: a
-- workflow keyed by customer or order id grew them without end, and the
-- `concurrency_keys` quota counted keys long unused.
--
-- A release that leaves a key with no holder and no waiter now deletes its
-- row in the same transaction (run keys: `release_slot` in
-- server/store/src/concurrency.rs; task keys: `task_slots_promote` below).
-- The release holds the row's lock, so no admission of the key is in
-- between; one that comes later waits on that lock, and its upsert then
-- inserts the row again once the delete commits. The checks run as
-- statements of their own, after the lock was taken, so they see every
-- waiter committed before it. A key left with a row by a release that had
-- to skip a locked waiter is deleted later by the reconcile loop's sweep.

CREATE OR REPLACE FUNCTION task_slots_promote(ns TEXT, wf TEXT, node TEXT, k TEXT) RETURNS INTEGER
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
    -- a key no task holds or waits for keeps no row (a waiter skipped
    -- above because it was locked still counts: it waits)
    IF promoted = 0
        AND NOT EXISTS (SELECT 1 FROM tasks
            WHERE namespace = ns AND workflow_name = wf AND concurrency_node = node
              AND concurrency_key = k AND status IN ('DISPATCHED', 'LEASED', 'HELD'))
        AND NOT EXISTS (SELECT 1 FROM tasks
            WHERE namespace = ns AND workflow_name = wf AND concurrency_node = node
              AND concurrency_key = k AND status = 'WAITING_SLOT') THEN
        DELETE FROM task_slots
        WHERE namespace = ns AND workflow_name = wf AND node_id = node AND key_value = k;
    END IF;
    RETURN promoted;
END $$;

-- The rows every key no longer in use left behind, once.
DELETE FROM concurrency_slots s
WHERE running = 0
  AND NOT EXISTS (SELECT 1 FROM runs r
      WHERE r.namespace = s.namespace AND r.workflow_name = s.workflow_name
        AND r.concurrency_key = s.key_value AND r.status = 'QUEUED');

DELETE FROM task_slots s
WHERE NOT EXISTS (SELECT 1 FROM tasks t
      WHERE t.namespace = s.namespace AND t.workflow_name = s.workflow_name
        AND t.concurrency_node = s.node_id AND t.concurrency_key = s.key_value
        AND t.status IN ('DISPATCHED', 'LEASED', 'HELD'))
  AND NOT EXISTS (SELECT 1 FROM tasks t
      WHERE t.namespace = s.namespace AND t.workflow_name = s.workflow_name
        AND t.concurrency_node = s.node_id AND t.concurrency_key = s.key_value
        AND t.status = 'WAITING_SLOT');
