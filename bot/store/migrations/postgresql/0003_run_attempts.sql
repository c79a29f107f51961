-- The attempts of a run (bot/runs.py): a re-run or a resume under the same run id is attempt n+1, with
-- alerts and series of its own; the earlier ones stay here, with how they ended ("ended normally", "gone",
-- "replaced by attempt 2"). No row for a run: its first attempt, still going.
CREATE TABLE run_attempts (
    run_id TEXT, attempt INTEGER, started_at DOUBLE PRECISION, ended_at DOUBLE PRECISION, end_reason TEXT,
    last_step BIGINT, PRIMARY KEY(run_id, attempt));
