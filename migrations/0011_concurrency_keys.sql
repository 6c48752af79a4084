-- Concurrency keys (issue 17): at most `max` runs of a workflow per value of
-- its `concurrency.key` at a time in a namespace, across all servers.
--
-- One row per (namespace, workflow, key value) counts the runs holding a
-- slot. Every admission and every release locks that row first, so the
-- count, the queue of QUEUED runs and the hand-over of a freed slot to the
-- oldest of them are serialised per key (decision 0020).
CREATE TABLE concurrency_slots (
    namespace     TEXT    NOT NULL,
    workflow_name TEXT    NOT NULL,
    key_value     TEXT    NOT NULL,
    running       INTEGER NOT NULL DEFAULT 0 CHECK (running >= 0),
    PRIMARY KEY (namespace, workflow_name, key_value)
);

-- Arrival order of the runs of a key: taken under the slot row's lock, so
-- it is the order in which admissions of one key committed.
CREATE SEQUENCE run_arrival_seq;

-- A run's key (NULL: its workflow declares no concurrency), its arrival,
-- the limit its version declares (what a freed slot is handed over under),
-- and whether it holds a slot now (RUNNING, PAUSED, COMPENSATING ones do;
-- QUEUED and ended ones do not).
ALTER TABLE runs ADD COLUMN concurrency_key TEXT;
ALTER TABLE runs ADD COLUMN concurrency_seq BIGINT;
ALTER TABLE runs ADD COLUMN concurrency_max INTEGER;
ALTER TABLE runs ADD COLUMN concurrency_holds BOOLEAN NOT NULL DEFAULT false;

-- The next QUEUED run of a key, oldest first.
CREATE INDEX runs_queued_by_key ON runs (namespace, workflow_name, concurrency_key, concurrency_seq)
    WHERE status = 'QUEUED';
-- The runs holding a slot of a key, oldest first (on_limit: cancel_oldest).
CREATE INDEX runs_holding_by_key ON runs (namespace, workflow_name, concurrency_key, concurrency_seq)
    WHERE concurrency_holds;
