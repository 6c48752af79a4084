-- The labels index holds only runs that have labels (decision 0050).
--
-- A GIN index writes its pending list's metapage for every row inserted,
-- and for every update that is not heap-only, whether or not the row's
-- labels give it any entry: a run without labels cost 146 bytes of WAL
-- per task in B1 (2026-12-06, pg_waldump over the window) for an index
-- that can never find it. A search by labels names at least one label
-- (the store adds `labels <> '{}'` to it), so no search needs those runs.
--
-- Plain CREATE INDEX (migrations run in a transaction): it holds off
-- writes to `runs` while it reads the table once.

DROP INDEX runs_by_labels;
CREATE INDEX runs_by_labels ON runs USING gin (labels jsonb_path_ops)
    WHERE labels <> '{}'::jsonb;
