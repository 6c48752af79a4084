-- Rate limits per queue and per key (issue 17, decision 0021).
--
-- A queue's limit is an operational setting shared by every workflow that
-- uses the queue: set through QueueService, read by every server's poll
-- hub (cached, refreshed each second). `per_key_*` applies to each
-- distinct value of a task's rate-limit key.
CREATE TABLE queue_rate_limits (
    namespace TEXT NOT NULL,
    queue TEXT NOT NULL,
    per_second DOUBLE PRECISION NOT NULL,
    burst INTEGER NOT NULL,
    per_key_per_second DOUBLE PRECISION,
    per_key_burst INTEGER,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, queue)
);

-- The value of the TASK node's `rate_limit_key` for the armed attempt,
-- read by the poll hub with the task's state before it takes a token.
ALTER TABLE tasks ADD COLUMN rate_limit_key TEXT;
