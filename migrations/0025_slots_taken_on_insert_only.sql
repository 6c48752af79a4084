-- The task-slot trigger on UPDATE goes (decision 0054).
--
-- Postgres locks a row before it runs a BEFORE UPDATE row trigger, whatever
-- the trigger's WHEN clause then says: every update of every task (its
-- lease, each heartbeat, its outcome) wrote a row lock into the WAL first,
-- about one per task in B1, for tasks that have no key at all.
--
-- What the trigger decided was already decided: a task re-armed by an
-- upsert fires the INSERT trigger first, whose decision (WAITING_SLOT and a
-- new arrival, or the slot) reaches the row through EXCLUDED, as 0013
-- says; task_slots_promote counts the holders itself before it moves a
-- waiter; and every other update that leaves a task DISPATCHED or HELD
-- (pause, resume, a lease expired or handed back) keeps the slot the task
-- already held, for which the trigger returned at once (0014). Freeing a
-- slot is an AFTER trigger, which locks nothing, and stays.

DROP TRIGGER tasks_take_slot_on_update ON tasks;
