-- The step of the alert that was posted for a fingerprint (the notification log, beside sent_severity,
-- sent_at, sent_resolved): `status` names it when the episode's first event was held back (inhibited,
-- silenced) and the alert posted came at a later step. NULL: rows from before, or nothing posted.
ALTER TABLE alerts ADD COLUMN sent_step BIGINT;
