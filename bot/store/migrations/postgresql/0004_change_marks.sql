-- What changed since a periodic pass last looked, so that a pass reads what changed, not everything stored:
-- - alerts.changed: the id of the transaction (txid_current(), 64 bits: no wraparound) that last changed
--   an alert's status, severity, acknowledgement or event, whoever wrote it (any replica, an ack, an
--   operator's UPDATE): set by the trigger below. The escalator (bot/escalation/scheduler.py) reads the
--   alerts changed by a transaction at or after the oldest one still running when it last looked
--   (txid_snapshot_xmin): a replica's transaction that commits late, whatever its clock, is still read.
--   Rows from before this migration keep NULL: the escalator's first pass reads every firing alert anyway.
-- - runs(last_seen): the runs heard from since the watchdog's last pass (bot/ingest/watchdog.py).
ALTER TABLE alerts ADD COLUMN changed BIGINT;
CREATE INDEX alerts_changed ON alerts(changed);
CREATE FUNCTION alerts_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.status IS DISTINCT FROM OLD.status OR NEW.severity IS DISTINCT FROM OLD.severity
       OR NEW.acked_by IS DISTINCT FROM OLD.acked_by OR NEW.event IS DISTINCT FROM OLD.event THEN
        NEW.changed := txid_current();
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER alerts_changed BEFORE INSERT OR UPDATE ON alerts FOR EACH ROW EXECUTE PROCEDURE alerts_changed();
CREATE INDEX runs_last_seen ON runs(last_seen);
