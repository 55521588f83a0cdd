-- Sampled conversations (issue 45): what a sampled unit's request asked (after its variant was
-- applied) and what it was answered, redacted before it was written; linked to its exposure by
-- request_id (the answer's id), and across a fan-out's variants by input_id; a reviewer's rating
-- in review (JSON).
ALTER TABLE exposures ADD COLUMN request_id TEXT;
CREATE TABLE IF NOT EXISTS samples (
    id BIGSERIAL PRIMARY KEY,
    experiment TEXT NOT NULL,
    variant TEXT NOT NULL,
    unit TEXT NOT NULL,
    request_id TEXT NOT NULL,
    input_id TEXT,
    ts DOUBLE PRECISION NOT NULL,
    request TEXT NOT NULL,
    response TEXT NOT NULL,
    finish_reason TEXT,
    error TEXT,
    prompt_tokens BIGINT,
    output_tokens BIGINT,
    latency_ms DOUBLE PRECISION,
    review TEXT
);
CREATE INDEX IF NOT EXISTS samples_by_experiment ON samples (experiment, id);
CREATE INDEX IF NOT EXISTS samples_by_age ON samples (experiment, ts);
CREATE INDEX IF NOT EXISTS samples_by_unit ON samples (unit);
CREATE INDEX IF NOT EXISTS events_by_unit ON events (unit);
CREATE INDEX IF NOT EXISTS exposures_by_unit_only ON exposures (unit);
