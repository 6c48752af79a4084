-- Bulk operations on runs (issue 17, decision 0019): cancel, retry, pause
-- or resume every run a ListRuns filter matches, as a long-running
-- operation. Any server claims one whose lease lapsed (FOR UPDATE SKIP
-- LOCKED) and walks its runs newest first by (created_at, id), a page at a
-- time. Each run's action commits in the same transaction as the advance
-- of `cursor_*` and the count it adds, fenced by `lease_owner`, so a
-- server that dies mid-page leaves counts that are exact and a cursor the
-- next owner resumes from.
CREATE TABLE bulk_operations (
    namespace TEXT NOT NULL,
    id UUID NOT NULL,
    -- CANCEL, RETRY, PAUSE or RESUME
    kind TEXT NOT NULL,
    -- PENDING, RUNNING, SUCCEEDED, CANCELLED or FAILED
    status TEXT NOT NULL,
    -- composer_store::runs::RunFilter as JSON, its time bound included
    filter JSONB NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    request_id TEXT,
    -- runs created before this match (the operation's own create time)
    matched BIGINT NOT NULL DEFAULT 0,
    succeeded BIGINT NOT NULL DEFAULT 0,
    skipped BIGINT NOT NULL DEFAULT 0,
    failed BIGINT NOT NULL DEFAULT 0,
    -- the first 20 failures: [{run_id, message}]
    failures JSONB NOT NULL DEFAULT '[]',
    created_by TEXT NOT NULL DEFAULT '',
    error TEXT,
    -- the last run done, in walk order; NULL: none yet
    cursor_created_at TIMESTAMPTZ,
    cursor_run_id UUID,
    -- the server working on it and until when; another takes it after
    lease_owner TEXT,
    lease_expires_at TIMESTAMPTZ,
    cancel_requested BOOLEAN NOT NULL DEFAULT false,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    ended_at TIMESTAMPTZ,
    PRIMARY KEY (id)
);

-- insert_bulk_operation: a request id names one operation per namespace
CREATE UNIQUE INDEX bulk_operations_request_id ON bulk_operations (namespace, request_id)
    WHERE request_id IS NOT NULL;
-- list_bulk_operations: newest first per namespace
CREATE INDEX bulk_operations_by_created ON bulk_operations (namespace, created_at DESC, id DESC);
-- claim_bulk_operation: the live ones (few at any time)
CREATE INDEX bulk_operations_live ON bulk_operations (lease_expires_at)
    WHERE status IN ('PENDING', 'RUNNING');
