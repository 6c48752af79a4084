-- The idempotency key index in byte order, so a search by key prefix is a
-- range of it under any database collation (decision 0052).
--
-- ListRuns' search took the keys by `LIKE 'prefix%'`, which no index can
-- serve from a parameter: at 10,000,000 runs a search matching nothing
-- walked every run of the namespace (3 s). The store now asks for the keys
-- from the prefix up to its successor, compared COLLATE "C"; in C order
-- the keys with a prefix are one contiguous range. Equality is the same
-- under every deterministic collation, so the index is as unique as before
-- and StartRun's ON CONFLICT still finds it.
--
-- Plain CREATE INDEX (migrations run in a transaction): it holds off
-- writes to `runs` while it reads the table once (5 s at 10,000,000 runs).

DROP INDEX runs_idempotency_key;
CREATE UNIQUE INDEX runs_idempotency_key ON runs (namespace, idempotency_key COLLATE "C")
    WHERE idempotency_key IS NOT NULL;
