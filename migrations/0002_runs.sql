-- The durable state of runs. One row per run in `runs`; its row lock
-- serialises the run's events (one transaction per event). Every row that
-- belongs to a namespace carries it, and every query filters by it.

-- runs: one per run. `record` is the engine's small run record (counters,
-- compensation stack, failed nodes); the columns beside it are what lists
-- and filters read.
CREATE TABLE runs (
    id               UUID        PRIMARY KEY,
    namespace        TEXT        NOT NULL,
    workflow_name    TEXT        NOT NULL,
    workflow_version INTEGER     NOT NULL,
    status           TEXT        NOT NULL,
    input            JSONB       NOT NULL,
    output           JSONB,
    error            JSONB,
    labels           JSONB       NOT NULL DEFAULT '{}'::jsonb,
    idempotency_key  TEXT,
    parent_run_id    UUID,
    parent_node      TEXT,
    parent_attempt   INTEGER,
    record           JSONB       NOT NULL,
    history_seq      BIGINT      NOT NULL DEFAULT 0,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    ended_at         TIMESTAMPTZ
);
-- StartRun with an idempotency key returns the run the key already names.
CREATE UNIQUE INDEX runs_idempotency_key ON runs (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- ListRuns: newest first, optionally by workflow or status.
CREATE INDEX runs_by_created ON runs (namespace, created_at DESC, id DESC);
CREATE INDEX runs_by_workflow ON runs (namespace, workflow_name, created_at DESC, id DESC);
CREATE INDEX runs_by_status ON runs (namespace, status, created_at DESC, id DESC);
CREATE INDEX runs_by_labels ON runs USING gin (labels jsonb_path_ops);
-- children of a run (cancel cascades, ListRuns by parent).
CREATE INDEX runs_by_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
-- retention: finished runs by age.
CREATE INDEX runs_ended ON runs (ended_at) WHERE ended_at IS NOT NULL;

-- run_nodes: the engine's state of each node (or MAP element) a run touched.
-- An event loads and writes only the rows it touches.
CREATE TABLE run_nodes (
    run_id     UUID        NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    node_key   TEXT        NOT NULL,
    status     TEXT        NOT NULL,
    state      JSONB       NOT NULL,
    started_at TIMESTAMPTZ,
    ended_at   TIMESTAMPTZ,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, node_key)
);

-- tasks: one per attempt-bearing unit (node or MAP element) of a run; the
-- row is re-armed for each attempt, so task_id is stable across attempts.
-- Fencing: every change of a leased task says
-- WHERE id = $1 AND attempt = $2 AND lease_token = $3.
-- fillfactor leaves room so heartbeats (lease_expires_at only, no indexed
-- column) are HOT updates that touch no index.
CREATE TABLE tasks (
    id                   UUID        PRIMARY KEY,
    namespace            TEXT        NOT NULL,
    run_id               UUID        NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    node_key             TEXT        NOT NULL,
    workflow_name        TEXT        NOT NULL,
    workflow_version     INTEGER     NOT NULL,
    queue                TEXT        NOT NULL,
    task_name            TEXT        NOT NULL,
    status               TEXT        NOT NULL,
    attempt              INTEGER     NOT NULL,
    input                JSONB       NOT NULL,
    heartbeat_timeout_ms BIGINT      NOT NULL,
    attempt_timeout_ms   BIGINT,
    lease_token          UUID,
    lease_owner          TEXT,
    lease_expires_at     TIMESTAMPTZ,
    attempt_deadline     TIMESTAMPTZ,
    dispatched_at        TIMESTAMPTZ,
    outcome              TEXT,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (run_id, node_key)
) WITH (fillfactor = 80);
-- recovery: leased tasks (their expiry is read from the heap, so heartbeats
-- touch no index) and tasks dispatched but never leased.
CREATE INDEX tasks_leased ON tasks (id) WHERE status = 'LEASED';
CREATE INDEX tasks_dispatched ON tasks (dispatched_at) WHERE status = 'DISPATCHED';

-- timers: WAIT, retry back-off, event timeouts, attempt and run timeouts.
CREATE TABLE timers (
    run_id    UUID        NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    timer_key TEXT        NOT NULL,
    namespace TEXT        NOT NULL,
    timer     JSONB       NOT NULL,
    fire_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, timer_key)
);
-- the timer loop: what is due.
CREATE INDEX timers_due ON timers (fire_at);

-- event_waits: WAIT_FOR_EVENT nodes waiting now, found by run or by
-- correlation key.
CREATE TABLE event_waits (
    run_id          UUID        NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    node_key        TEXT        NOT NULL,
    namespace       TEXT        NOT NULL,
    event_name      TEXT        NOT NULL,
    correlation_key TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, node_key)
);
CREATE INDEX event_waits_by_correlation ON event_waits (namespace, correlation_key, event_name)
    WHERE correlation_key IS NOT NULL;

-- pending_events: events that found no wait yet. To a run: kept until the
-- run consumes them or ends. To a correlation key: kept until expires_at.
CREATE TABLE pending_events (
    id              BIGSERIAL   PRIMARY KEY,
    namespace       TEXT        NOT NULL,
    run_id          UUID        REFERENCES runs (id) ON DELETE CASCADE,
    correlation_key TEXT,
    event_name      TEXT        NOT NULL,
    payload         JSONB       NOT NULL,
    expires_at      TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((run_id IS NULL) <> (correlation_key IS NULL))
);
CREATE INDEX pending_events_by_run ON pending_events (run_id, event_name, id)
    WHERE run_id IS NOT NULL;
CREATE INDEX pending_events_by_correlation ON pending_events (namespace, correlation_key, event_name, id)
    WHERE correlation_key IS NOT NULL;
CREATE INDEX pending_events_expiry ON pending_events (expires_at) WHERE expires_at IS NOT NULL;

-- run_inbox: events for another run, written in one run's transaction and
-- applied in the target's own (a child's end to its parent, a parent's
-- cancel to its children), so no transaction locks two runs.
CREATE TABLE run_inbox (
    id         BIGSERIAL   PRIMARY KEY,
    run_id     UUID        NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    event      JSONB       NOT NULL,
    actor      TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX run_inbox_by_run ON run_inbox (run_id, id);

-- outbox: tasks to XADD to Redis, written in the event's transaction and
-- drained by every server's enqueuer.
CREATE TABLE outbox (
    id         BIGSERIAL   PRIMARY KEY,
    namespace  TEXT        NOT NULL,
    queue      TEXT        NOT NULL,
    task_id    UUID        NOT NULL,
    attempt    INTEGER     NOT NULL,
    shard_key  UUID        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- idempotency_keys: SendEvent request ids (StartRun keys live on runs).
CREATE TABLE idempotency_keys (
    namespace  TEXT        NOT NULL,
    scope      TEXT        NOT NULL,
    key        TEXT        NOT NULL,
    result     JSONB       NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, scope, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);

-- run_events: the append-only history, partitioned by time from the first
-- migration so retention drops whole partitions instead of deleting rows.
-- Partitions are created ahead by composer_ensure_history_partitions (the
-- server calls it at start and daily); the default partition catches
-- anything outside them, so no insert ever fails.
CREATE TABLE run_events (
    run_id     UUID        NOT NULL,
    seq        BIGINT      NOT NULL,
    namespace  TEXT        NOT NULL,
    event_type TEXT        NOT NULL,
    node_key   TEXT,
    attempt    INTEGER,
    actor      TEXT        NOT NULL,
    details    JSONB       NOT NULL DEFAULT '{}'::jsonb,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE run_events_default PARTITION OF run_events DEFAULT;

CREATE FUNCTION composer_ensure_history_partitions(days_ahead INTEGER)
RETURNS INTEGER LANGUAGE plpgsql AS $$
DECLARE
    day DATE;
    created INTEGER := 0;
    name TEXT;
BEGIN
    FOR i IN 0..days_ahead LOOP
        day := (now() AT TIME ZONE 'UTC')::date + i;
        name := 'run_events_' || to_char(day, 'YYYYMMDD');
        IF to_regclass(name) IS NULL THEN
            BEGIN
                EXECUTE format(
                    'CREATE TABLE %I PARTITION OF run_events FOR VALUES FROM (%L) TO (%L)',
                    name, day::timestamp AT TIME ZONE 'UTC', (day + 1)::timestamp AT TIME ZONE 'UTC');
                created := created + 1;
            EXCEPTION WHEN check_violation THEN
                -- rows for that day already sit in the default partition
                -- (the server was down for days): leave them there
                NULL;
            END;
        END IF;
    END LOOP;
    RETURN created;
END $$;

SELECT composer_ensure_history_partitions(7);
