//! Eval runs started from the review page (`eval_runs`): what was asked (the samples' filter and
//! the judge), by whom, its status (`running`, then `done` or `failed`), and when it ended its
//! summary (JSON) and HTML report. The run itself is the server's (`abserve_eval` in process);
//! while it runs, its process writes a heartbeat every [`HEARTBEAT`] seconds, and a run still
//! `running` whose heartbeat is older than [`STALE`] seconds is read as `interrupted` (its server
//! stopped during it).

use serde::Serialize;
use serde_json::Value;

use super::{now, Pool, Store, StoreError};

/// Seconds between a running run's heartbeats.
pub const HEARTBEAT: f64 = 5.0;
/// A running run whose heartbeat is this old is `interrupted`.
pub const STALE: f64 = 30.0;

/// One eval run, without its report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalRun {
    pub id: i64,
    pub experiment: String,
    /// When it was started (seconds since the Unix epoch).
    pub at: f64,
    /// The name of the key that started it.
    pub who: String,
    /// What was asked: `{filter, judge, limit}`.
    pub request: Value,
    /// Dataset rows (samples) it replays.
    pub rows: u64,
    /// `running`, `done`, `failed`, or `interrupted` (still `running` in the store, its
    /// heartbeat stopped).
    pub status: String,
    pub finished: Option<f64>,
    pub error: Option<String>,
    /// The eval's summary (`abserve_eval::Summary`) when done.
    pub summary: Option<Value>,
}

type Row = (
    i64,
    String,
    f64,
    String,
    String,
    i64,
    String,
    Option<f64>,
    Option<String>,
    Option<String>,
    Option<f64>,
);

fn run_of(r: Row) -> EvalRun {
    let (id, experiment, at, who, request, rows, mut status, finished, error, summary, beat) = r;
    if status == "running" && now() - beat.unwrap_or(at) > STALE {
        status = "interrupted".into();
    }
    EvalRun {
        id,
        experiment,
        at,
        who,
        request: serde_json::from_str(&request).unwrap_or(Value::Null),
        rows: rows.max(0) as u64,
        status,
        finished,
        error,
        summary: summary.and_then(|s| serde_json::from_str(&s).ok()),
    }
}

const COLUMNS: &str =
    "id, experiment, ts, who, request, rows, status, finished, error, summary, heartbeat";

impl Store {
    /// Records a started run (`running`); answers its id.
    pub async fn start_eval_run(
        &self,
        experiment: &str,
        who: &str,
        request: &Value,
        rows: u64,
    ) -> Result<i64, StoreError> {
        let q = "INSERT INTO eval_runs (experiment, ts, who, request, rows, status, heartbeat) VALUES ($1, $2, $3, $4, $5, 'running', $2) RETURNING id";
        let rows = rows.min(i64::MAX as u64) as i64;
        Ok(on_pool!(self, p => sqlx::query_scalar::<_, i64>(q)
            .bind(experiment).bind(now()).bind(who).bind(request.to_string()).bind(rows)
            .fetch_one(p).await?))
    }

    /// A running run's heartbeat: its process is still at it (at `at`, seconds since the epoch).
    pub async fn beat_eval_run(&self, id: i64, at: f64) -> Result<(), StoreError> {
        let q = "UPDATE eval_runs SET heartbeat = $2 WHERE id = $1 AND status = 'running'";
        on_pool!(self, p => sqlx::query(q).bind(id).bind(at).execute(p).await?.rows_affected());
        Ok(())
    }

    /// Ends a run: `done` with its summary and report, or `failed` with why.
    pub async fn finish_eval_run(
        &self,
        id: i64,
        outcome: Result<(&Value, &str), &str>,
    ) -> Result<(), StoreError> {
        let q = "UPDATE eval_runs SET status = $2, finished = $3, error = $4, summary = $5, report = $6 WHERE id = $1";
        let (status, error, summary, report) = match outcome {
            Ok((s, r)) => ("done", None, Some(s.to_string()), Some(r.to_string())),
            Err(e) => ("failed", Some(e.to_string()), None, None),
        };
        on_pool!(self, p => sqlx::query(q)
            .bind(id).bind(status).bind(now()).bind(error).bind(summary).bind(report)
            .execute(p).await?.rows_affected());
        Ok(())
    }

    /// An experiment's runs, newest first (at most `limit`).
    pub async fn eval_runs(
        &self,
        experiment: &str,
        limit: u32,
    ) -> Result<Vec<EvalRun>, StoreError> {
        let q = format!(
            "SELECT {COLUMNS} FROM eval_runs WHERE experiment = $1 ORDER BY id DESC LIMIT $2"
        );
        let rows: Vec<Row> = on_pool!(self, p => sqlx::query_as(&q)
            .bind(experiment).bind(i64::from(limit)).fetch_all(p).await?);
        Ok(rows.into_iter().map(run_of).collect())
    }

    /// One run of an experiment.
    pub async fn eval_run(&self, experiment: &str, id: i64) -> Result<Option<EvalRun>, StoreError> {
        let q = format!("SELECT {COLUMNS} FROM eval_runs WHERE experiment = $1 AND id = $2");
        let row: Option<Row> = on_pool!(self, p => sqlx::query_as(&q)
            .bind(experiment).bind(id).fetch_optional(p).await?);
        Ok(row.map(run_of))
    }

    /// A finished run's HTML report.
    pub async fn eval_report(
        &self,
        experiment: &str,
        id: i64,
    ) -> Result<Option<String>, StoreError> {
        let q = "SELECT report FROM eval_runs WHERE experiment = $1 AND id = $2";
        let r: Option<Option<String>> = on_pool!(self, p => sqlx::query_scalar(q)
            .bind(experiment).bind(id).fetch_optional(p).await?);
        Ok(r.flatten())
    }
}
