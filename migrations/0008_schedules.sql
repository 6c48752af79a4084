-- Schedules (docs/schedules.md, decision 0016): a row per schedule, which
-- the scheduler of every server claims with FOR UPDATE SKIP LOCKED when it
-- is due. Each fire starts a run with the idempotency key
-- `schedule:<id>:<fire time>` in the same transaction that advances
-- next_fire_at, so a fire starts one run however many servers run.
CREATE TABLE schedules (
    namespace TEXT NOT NULL,
    id TEXT NOT NULL,
    -- composer_engine::schedule::ScheduleSpec as JSON (cron + zone, or
    -- interval + anchor)
    spec JSONB NOT NULL,
    -- what a fire starts: {workflow_name, version (0: latest at fire
    -- time), input, labels}
    action JSONB NOT NULL,
    -- SKIP, BUFFER_ONE, ALLOW_ALL or CANCEL_PREVIOUS
    overlap TEXT NOT NULL,
    catch_up_window_ms BIGINT NOT NULL,
    jitter_ms BIGINT NOT NULL,
    paused BOOLEAN NOT NULL DEFAULT false,
    note TEXT NOT NULL DEFAULT '',
    -- the next fire time as the spec says it; NULL: the spec never fires
    -- again
    next_fire_at TIMESTAMPTZ,
    -- next_fire_at plus the fire's jitter: when the scheduler claims it
    next_due_at TIMESTAMPTZ,
    -- BUFFER_ONE: the one fire waiting for the running run to end
    buffered_fire_at TIMESTAMPTZ,
    -- the run the last started fire started (what overlap looks at)
    last_run_id UUID,
    -- the last fires, newest first: [{fire_time, run_id, outcome}]
    recent_fires JSONB NOT NULL DEFAULT '[]',
    fired_count BIGINT NOT NULL DEFAULT 0,
    skipped_count BIGINT NOT NULL DEFAULT 0,
    missed_count BIGINT NOT NULL DEFAULT 0,
    -- why the last fire could not start a run (a workflow deleted, an
    -- input the latest version refuses); NULL after a fire that started
    last_error TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, id)
);

-- claim_due_schedules: the due ones, earliest first
CREATE INDEX schedules_due ON schedules (next_due_at) WHERE NOT paused;
-- claim_due_schedules: the ones holding a buffered fire
CREATE INDEX schedules_buffered ON schedules (namespace, id)
    WHERE buffered_fire_at IS NOT NULL AND NOT paused;
