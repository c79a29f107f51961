-- The schema as it was before versioned migrations (CREATE ... IF NOT EXISTS: a state file from then keeps its rows).
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, project TEXT, labels TEXT, devices TEXT, first_seen REAL, last_seen REAL,
    last_step INTEGER, last_heartbeat REAL, last_progress REAL, paused INTEGER DEFAULT 0, gone INTEGER DEFAULT 0);
CREATE TABLE IF NOT EXISTS alerts (
    fingerprint TEXT PRIMARY KEY, run_id TEXT, rule TEXT, device TEXT, severity TEXT, status TEXT,
    first_step INTEGER, last_step INTEGER, updated_at REAL, event TEXT,
    sent_severity TEXT, sent_at REAL, sent_resolved INTEGER DEFAULT 0, acked_by TEXT);
CREATE INDEX IF NOT EXISTS alerts_run ON alerts(run_id, status, severity);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT, created_at REAL, receiver TEXT, channel TEXT, kind TEXT,
    key TEXT, run_id TEXT, payload TEXT, attempts INTEGER DEFAULT 0, next_at REAL, delivered_at REAL,
    error TEXT, dead_at REAL, posted_ref TEXT);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox(delivered_at, next_at);
CREATE TABLE IF NOT EXISTS messages (
    key TEXT PRIMARY KEY, receiver TEXT, channel TEXT, ts TEXT, created_at REAL);
CREATE TABLE IF NOT EXISTS commands (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE, created_at REAL, user TEXT, source TEXT, project TEXT,
    run_id TEXT, text TEXT, verb TEXT, action TEXT, params TEXT, apply_step INTEGER, status TEXT, detail TEXT,
    results TEXT DEFAULT '{}', origin TEXT DEFAULT '{}', expires_at REAL, updated_at REAL);
CREATE INDEX IF NOT EXISTS commands_open ON commands(status, run_id);
CREATE TABLE IF NOT EXISTS level_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, device TEXT, step INTEGER, at REAL, rule TEXT, action TEXT,
    who TEXT, why TEXT, detail TEXT, command_id TEXT);
CREATE INDEX IF NOT EXISTS level_changes_run ON level_changes(run_id, seq);
CREATE TABLE IF NOT EXISTS slack_signed (signature TEXT PRIMARY KEY, ts INTEGER);
CREATE INDEX IF NOT EXISTS slack_signed_ts ON slack_signed(ts);
CREATE TABLE IF NOT EXISTS silences (
    id INTEGER PRIMARY KEY AUTOINCREMENT, expires_at REAL, run_id TEXT, rule TEXT, device TEXT,
    severity TEXT, created_by TEXT, comment TEXT);
CREATE TABLE IF NOT EXISTS escalations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, rule TEXT, policy TEXT, receiver TEXT, channel TEXT,
    started_at REAL, next_step INTEGER DEFAULT 0, state TEXT DEFAULT 'active', paused_at REAL, shift REAL DEFAULT 0,
    acked_by TEXT, closed_at REAL, mail_root TEXT, owner TEXT, lease_until REAL);
CREATE INDEX IF NOT EXISTS escalations_open ON escalations(state, run_id, rule);
CREATE TABLE IF NOT EXISTS escalation_steps (
    id INTEGER PRIMARY KEY AUTOINCREMENT, escalation_id INTEGER, step INTEGER, round INTEGER, level INTEGER,
    at REAL, how TEXT, targets TEXT, detail TEXT);
CREATE TABLE IF NOT EXISTS ack_links_used (nonce TEXT PRIMARY KEY, used_at REAL, user TEXT);
CREATE TABLE IF NOT EXISTS run_ends (run_id TEXT PRIMARY KEY, at REAL, step INTEGER);
CREATE TABLE IF NOT EXISTS digest_marks (channel TEXT PRIMARY KEY, last_at REAL);
CREATE TABLE IF NOT EXISTS digest_items (
    id INTEGER PRIMARY KEY AUTOINCREMENT, channel TEXT, at REAL, run_id TEXT, rule TEXT, severity TEXT, text TEXT);
