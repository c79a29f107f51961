-- Outbox claims (who is delivering a row, until when) and owner leases (escalator, digests): the
-- columns the PostgreSQL store needs for several replicas. One SQLite process is their only user.
ALTER TABLE outbox ADD COLUMN claimed_by TEXT;
ALTER TABLE outbox ADD COLUMN claim_until REAL;
CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, owner TEXT, until REAL);
