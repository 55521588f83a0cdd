-- Results of queued eval jobs (abserve worker --store): one row per job id, written once.
CREATE TABLE IF NOT EXISTS eval_results (job_id TEXT PRIMARY KEY, run TEXT NOT NULL, result TEXT NOT NULL, ts REAL NOT NULL);
CREATE INDEX IF NOT EXISTS eval_results_by_run ON eval_results (run);
