-- Eval runs started from the review page (issue 45): the experiment's variants replayed over a
-- filtered set of its sampled conversations in this process, judged pairwise when a judge model
-- is named; the summary and the HTML report kept with the run.
CREATE TABLE IF NOT EXISTS eval_runs (
    id BIGSERIAL PRIMARY KEY,
    experiment TEXT NOT NULL,
    ts DOUBLE PRECISION NOT NULL,
    who TEXT NOT NULL,
    request TEXT NOT NULL,
    rows BIGINT NOT NULL,
    status TEXT NOT NULL,
    finished DOUBLE PRECISION,
    error TEXT,
    summary TEXT,
    report TEXT
);
CREATE INDEX IF NOT EXISTS eval_runs_by_experiment ON eval_runs (experiment, id);
