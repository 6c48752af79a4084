-- The workflow index carries each run's version and status (INCLUDE), so
-- CountRuns by workflow and version reads the index alone.
--
-- CountRuns stops after its limit (100,000) of matching runs, but each
-- match by workflow and version was a visit to the run's row on the heap
-- for its version and status: at 10,000,000 runs, half of them of the
-- asked version, about 200,000 rows of 700 bytes, p99 332 ms (B6,
-- 2026-12-07 12:21). An index-only scan reads the index's entries, about
-- 80 bytes each. `status` is in `runs_by_status` already, so no update
-- that changes it was heap-only: the wider entries cost no new index
-- writes, only their width.
--
-- Plain CREATE INDEX (migrations run in a transaction): it holds off
-- writes to `runs` while it reads the table once.

DROP INDEX runs_by_workflow;
CREATE INDEX runs_by_workflow ON runs (namespace, workflow_name, created_at DESC, id DESC)
    INCLUDE (workflow_version, status);
