-- Task and node rows no longer reference their run by a foreign key
-- (decision 0054).
--
-- Every task and node row is inserted by an event transaction that holds
-- its run's row lock (or that inserted the run), so the run exists when
-- they are written and cannot go before the transaction ends: retention
-- takes its runs FOR UPDATE SKIP LOCKED. The foreign key checked that
-- again for every row, through a trigger running a query of its own (a
-- probe and a KEY SHARE lock of the run): about 5 % of Postgres's CPU in
-- B1, two checks per task. Retention now deletes a run's task and node
-- rows by name in the statement that deletes the run, as it already did
-- its history.

ALTER TABLE run_nodes DROP CONSTRAINT run_nodes_run_id_fkey;
ALTER TABLE tasks DROP CONSTRAINT tasks_run_id_fkey;
