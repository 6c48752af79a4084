-- Traces (docs/operations.md, "Traces"): the W3C traceparent a run's spans
-- hang under, and the one a task's lease span hangs under. NULL unless the
-- server exports traces; a nullable column without a default costs no
-- rewrite and no space in rows that leave it NULL.
ALTER TABLE runs ADD COLUMN traceparent TEXT;
ALTER TABLE tasks ADD COLUMN traceparent TEXT;
