-- Less room on the page than 0026 gave, for the disk's sake (decision
-- 0054).
--
-- At fillfactor 50 (runs, run_nodes) and 60 (tasks) every update in B1
-- but a status change stayed on its page, but an insert filled a page
-- only to half, and a run that ended is never updated again: B6's disk
-- per run (quick profile, 100,000 runs with history) went from 1,294 to
-- 1,545 bytes for the run's row and from 4,044 to 4,764 for its tasks,
-- node rows and history, and ten million runs no longer fitted on the
-- benchmark's disk. At 65 / 65 / 70 they take 1,314 and 4,334 bytes, and
-- B1 writes 3,182 WAL bytes per task against 3,045 at 50 / 50 / 60 and
-- 3,320 at the old 70 / 80 / 80: half the saving for a third of the
-- space.
ALTER TABLE runs SET (fillfactor = 65);
ALTER TABLE run_nodes SET (fillfactor = 65);
ALTER TABLE tasks SET (fillfactor = 70);
