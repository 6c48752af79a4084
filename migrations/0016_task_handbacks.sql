-- handbacks: how many unconfirmed leases of the task's current attempt went
-- back to DISPATCHED without spending the attempt (decision 0012). Only the
-- first is free (decision 0039): a task whose worker keeps dying before it
-- confirms receipt would otherwise be handed out forever, always as the
-- same attempt. A new attempt starts again at 0.
--
-- A constant default: no table rewrite, no index touched, and the column is
-- not indexed, so incrementing it keeps the update heap-only.
ALTER TABLE tasks ADD COLUMN handbacks SMALLINT NOT NULL DEFAULT 0;
