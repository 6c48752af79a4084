-- Recovery republishes a dispatched task never leased only for a queue
-- some worker polls on the server that looks (decision 0040): a queue
-- nobody polls keeps its messages in its stream, and a backlog there is
-- never visited. The lookup is by queue, oldest first.
CREATE INDEX tasks_dispatched_by_queue ON tasks (namespace, queue, dispatched_at)
    WHERE status = 'DISPATCHED';
DROP INDEX tasks_dispatched;
