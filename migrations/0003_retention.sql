-- Retention: history partitions wholly older than the cutoff are dropped
-- (cheap, no vacuum debt), instead of deleting their rows one by one.
CREATE FUNCTION composer_drop_history_partitions(cutoff TIMESTAMPTZ)
RETURNS INTEGER LANGUAGE plpgsql AS $$
DECLARE
    part RECORD;
    dropped INTEGER := 0;
BEGIN
    FOR part IN
        SELECT c.relname AS name
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE p.relname = 'run_events' AND c.relname ~ '^run_events_[0-9]{8}$'
    LOOP
        -- a day's partition ends at the next midnight (UTC)
        IF (to_date(substring(part.name from 12), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC' <= cutoff THEN
            EXECUTE format('DROP TABLE %I', part.name);
            dropped := dropped + 1;
        END IF;
    END LOOP;
    RETURN dropped;
END $$;
