-- What changed since a periodic pass last looked, so that a pass reads what changed, not everything stored:
-- - alerts.changed: a number that grows with every write changing an alert's status, severity,
--   acknowledgement or event, whoever writes it (ingest, an ack, an operator's UPDATE): set by the triggers
--   below from the one counter in alert_changes (never reused, even after prune_runs deleted the newest rows).
--   The escalator (bot/escalation/scheduler.py) reads the alerts whose number is at least the next one it
--   had not seen. Rows from before this migration keep NULL: the escalator's first pass reads every
--   firing alert anyway.
-- - runs(last_seen): the runs heard from since the watchdog's last pass (bot/ingest/watchdog.py).
CREATE TABLE IF NOT EXISTS alert_changes (n INTEGER NOT NULL);
INSERT INTO alert_changes(n) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM alert_changes);
ALTER TABLE alerts ADD COLUMN changed INTEGER;
CREATE INDEX IF NOT EXISTS alerts_changed ON alerts(changed);
CREATE TRIGGER IF NOT EXISTS alerts_changed_insert AFTER INSERT ON alerts BEGIN
    UPDATE alert_changes SET n = n + 1;
    UPDATE alerts SET changed = (SELECT n FROM alert_changes) WHERE rowid = NEW.rowid;
END;
CREATE TRIGGER IF NOT EXISTS alerts_changed_update AFTER UPDATE OF status, severity, acked_by, event ON alerts
WHEN NEW.status IS NOT OLD.status OR NEW.severity IS NOT OLD.severity OR NEW.acked_by IS NOT OLD.acked_by
    OR NEW.event IS NOT OLD.event
BEGIN
    UPDATE alert_changes SET n = n + 1;
    UPDATE alerts SET changed = (SELECT n FROM alert_changes) WHERE rowid = NEW.rowid;
END;
CREATE INDEX IF NOT EXISTS runs_last_seen ON runs(last_seen);
