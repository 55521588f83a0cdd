-- The first schema, as in migrations/sqlite/0001_initial.sql (same tables, columns and keys).
CREATE TABLE IF NOT EXISTS experiments (name TEXT PRIMARY KEY, definition TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS exposures (
    id BIGSERIAL PRIMARY KEY, experiment TEXT NOT NULL, variant TEXT NOT NULL, unit TEXT NOT NULL,
    forced BOOLEAN NOT NULL, ts DOUBLE PRECISION NOT NULL, latency_ms DOUBLE PRECISION, ttft_ms DOUBLE PRECISION,
    output_tokens BIGINT, error TEXT);
CREATE INDEX IF NOT EXISTS exposures_by_unit ON exposures (experiment, unit);
CREATE TABLE IF NOT EXISTS events (
    id BIGSERIAL PRIMARY KEY, experiment TEXT NOT NULL, unit TEXT NOT NULL, metric TEXT NOT NULL,
    value DOUBLE PRECISION NOT NULL, ts DOUBLE PRECISION NOT NULL, batch_id TEXT);
CREATE INDEX IF NOT EXISTS events_by_experiment ON events (experiment, metric);
CREATE TABLE IF NOT EXISTS event_batches (experiment TEXT NOT NULL, batch_id TEXT NOT NULL, events BIGINT NOT NULL,
    PRIMARY KEY (experiment, batch_id));
