-- The first schema. IF NOT EXISTS: stores made before sqlx (versioned with user_version = 1)
-- already have these tables and keep their rows.
CREATE TABLE IF NOT EXISTS experiments (name TEXT PRIMARY KEY, definition TEXT NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS exposures (
    id INTEGER PRIMARY KEY, experiment TEXT NOT NULL, variant TEXT NOT NULL, unit TEXT NOT NULL,
    forced INTEGER NOT NULL, ts REAL NOT NULL, latency_ms REAL, ttft_ms REAL, output_tokens INTEGER,
    error TEXT);
CREATE INDEX IF NOT EXISTS exposures_by_unit ON exposures (experiment, unit);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, experiment TEXT NOT NULL, unit TEXT NOT NULL, metric TEXT NOT NULL,
    value REAL NOT NULL, ts REAL NOT NULL, batch_id TEXT);
CREATE INDEX IF NOT EXISTS events_by_experiment ON events (experiment, metric);
CREATE TABLE IF NOT EXISTS event_batches (experiment TEXT NOT NULL, batch_id TEXT NOT NULL, events INTEGER NOT NULL,
    PRIMARY KEY (experiment, batch_id));
