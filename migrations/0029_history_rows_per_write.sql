-- A history row holds the events one write appended to a run, up to 16 of
-- them and about 1.5 KB, instead of one row per event.
--
-- B1 appended 2.62 history rows per task, each with its own primary-key
-- entry: 718 of a task's 3,206 WAL bytes (BENCHMARKS.md, 2026-12-07
-- 11:03). A task's completion and the next task's scheduling are one
-- write, so grouping them halves the rows and the key entries.
--
-- The row's own columns are its first event, `seq` that event's number;
-- `more` is NULL or the events after it, numbered on from `seq`, each as
-- [event_type, node_key, attempt, actor, details]. Rows written before
-- this migration hold one event each and need no change.

ALTER TABLE run_events ADD COLUMN more JSONB;

-- One row per event, as the table held them before: for operators reading
-- history with SQL and for tests checking it.
CREATE VIEW run_events_each AS
    SELECT run_id, seq, namespace, event_type, node_key, attempt, actor, details, created_at
      FROM run_events
    UNION ALL
    SELECT e.run_id, e.seq + m.ord, e.namespace, m.event->>0, m.event->>1,
           (m.event->>2)::int, m.event->>3, m.event->4, e.created_at
      FROM run_events e
      CROSS JOIN LATERAL jsonb_array_elements(e.more) WITH ORDINALITY AS m(event, ord)
     WHERE e.more IS NOT NULL;
