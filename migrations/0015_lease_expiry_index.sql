-- Recovery finds expired leases through an index in expiry order, so a
-- scan reads only the leases that ran out since it last looked.
--
-- `tasks_leased` (0002) indexed leased tasks by id and left the expiry in
-- the heap, to keep heartbeats heap-only. Once the table had statistics,
-- the planner read it with a bitmap scan, which never marks the entries of
-- tasks that left LEASED as dead: every scan visited every task leased
-- since the last vacuum (2026-12-02, three servers under load: 34,905
-- index entries and 2,444 heap pages for 352 leased tasks, 15-25 ms a
-- scan, two scans per server twice a second).
--
-- Ordered by expiry, a scan stops at now(), and an entry whose task has
-- left LEASED is passed once, after its expiry, and marked dead then. The
-- price: a heartbeat that extends a lease writes an index entry (it was
-- heap-only), once per heartbeat rather than twice a second per server.
--
-- Plain CREATE INDEX (migrations run in a transaction): it holds off
-- writes to `tasks` while it reads the table once.

CREATE INDEX tasks_lease_expiry ON tasks (lease_expires_at) WHERE status = 'LEASED';
DROP INDEX tasks_leased;
