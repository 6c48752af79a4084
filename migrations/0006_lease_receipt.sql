-- lease_confirmed: NULL for a lease whose worker did not ask to confirm
-- receipt; false until the first Heartbeat of a worker that did, true
-- after. An unconfirmed lease past its (short) expiry goes back to
-- DISPATCHED with the same attempt instead of expiring (decision 0012).
ALTER TABLE tasks ADD COLUMN lease_confirmed BOOLEAN;
