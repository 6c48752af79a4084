-- Flow control (issue 17): pausing runs.
--
-- A paused run's stored status is PAUSED (the engine's own status stays in
-- `record`, and comes back on resume). Its tasks that would be dispatched
-- are HELD instead: a row without an outbox row, which no poll can lease
-- and the lost-dispatch loop does not republish. Its timers stay in place,
-- marked held, so the timer loop's index does not see them: they fire on
-- resume if they fell due meanwhile, and a run paused for long with many
-- due timers costs the loop nothing.
ALTER TABLE timers ADD COLUMN held BOOLEAN NOT NULL DEFAULT false;
DROP INDEX timers_due;
CREATE INDEX timers_due ON timers (fire_at) WHERE NOT held;

-- HELD tasks of a run, found on resume through tasks' (run_id, node_key)
-- unique index; no index of their own is needed.

-- Dispatch priority, 1 (lowest) to 5 (highest), 3 by default: set on the
-- run, copied to each task it arms and to each outbox row, which the
-- enqueuer sends to the stream of that priority (decision 0017).
ALTER TABLE runs ADD COLUMN priority SMALLINT NOT NULL DEFAULT 3;
ALTER TABLE tasks ADD COLUMN priority SMALLINT NOT NULL DEFAULT 3;
ALTER TABLE outbox ADD COLUMN priority SMALLINT NOT NULL DEFAULT 3;
