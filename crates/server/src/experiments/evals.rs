//! Eval runs started from the review page: the experiment's variants replayed over a filtered
//! set of its sampled conversations (`Store::dataset`, the rows `abserve experiments samples`
//! exports), answered by this process's models in the `batch` class (live traffic first), and
//! judged pairwise against the control in both orders when a judge model of the registry is
//! named (`abserve_eval`'s judge scorer: a verdict counts only when both orders agree). The
//! run's summary and HTML report are kept with it in the store (`eval_runs`).
//!
//! Invariants: at most one run at a time per process (a second is refused with 409 while one
//! runs); at most [`MAX_ROWS`] rows; a run is `running` until it is written `done` or `failed`,
//! its heartbeat written every few seconds meanwhile (a process stopped during a run leaves it
//! without one: it reads as `interrupted`, `abserve_ab::EvalRun`); the run's working files live
//! in a temporary folder removed when it ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use abserve_ab::SampleQuery;
use abserve_eval::{
    Dataset, EvalConfig, Options, ResultRow, RunFacts, Scorer, ScorerKind, Source, Target,
};
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::ControlPlane;
use crate::error::ApiError;

/// The most rows (samples) one run replays.
pub const MAX_ROWS: u32 = 500;
/// Rows a run replays when its filter sets no `limit`.
const DEFAULT_ROWS: u32 = 50;

/// Whether a run of this control plane is running (one at a time).
#[derive(Default)]
pub struct Runs(Arc<AtomicBool>);

/// What to evaluate: the samples `filter` selects (the review page's filters; its `limit`: how
/// many, newest first, default 50, at most 500); whose answers (`replay`, the default: every
/// variant answers each sample's input now; `stored`: the answers the variants gave a fan-out
/// input, kept as its samples — only inputs every variant answered); and the judge model (an id
/// of `GET /v1/models`) that compares each variant's answer with the control's, in both orders;
/// without one, the answers are only counted and timed.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EvalBody {
    #[serde(default)]
    #[schema(value_type = Object)]
    filter: Option<serde_json::Value>,
    #[serde(default)]
    judge: Option<String>,
    #[serde(default)]
    answers: Answers,
}

/// Whose answers a run judges.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Deserialize, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Answers {
    /// Every variant answers each sample's input now.
    #[default]
    Replay,
    /// The answers the variants gave a fan-out input (its samples).
    Stored,
}

/// The one run's place, cleared when the run ends, however it ends.
struct Slot(Arc<AtomicBool>);

impl Runs {
    fn take(&self) -> Option<Slot> {
        self.0
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Slot(self.0.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The eval's configuration: the experiment as it is now, and the judge scorer when a judge is
/// named (its default prompt, the model by id).
fn config(e: &abserve_ab::Experiment, judge: Option<&str>) -> EvalConfig {
    let scorers = judge
        .map(|m| Scorer {
            name: "judge".into(),
            kind: ScorerKind::Judge {
                url: None,
                model: Some(m.to_string()),
                prompt: abserve_eval::DEFAULT_JUDGE_PROMPT.into(),
                seed: 0,
            },
        })
        .into_iter()
        .collect();
    EvalConfig {
        experiment: e.clone(),
        scorers,
    }
}

/// The body's filter as a sample query with its row limit checked.
fn filter_of(body: &EvalBody) -> Result<SampleQuery, ApiError> {
    let mut q: SampleQuery = match &body.filter {
        None => SampleQuery::default(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| ApiError::invalid_param("filter", e.to_string()))?,
    };
    match q.limit {
        Some(n) if n == 0 || n > MAX_ROWS => {
            return Err(ApiError::invalid_param(
                "filter.limit",
                format!("a run replays between 1 and {MAX_ROWS} samples; {n} were asked"),
            ))
        }
        None => q.limit = Some(DEFAULT_ROWS),
        _ => {}
    }
    if q.before.is_some() {
        return Err(ApiError::invalid_param(
            "filter.before",
            "a run takes the newest samples its filter selects; leave out `before`",
        ));
    }
    Ok(q)
}

/// Starts an eval run over the samples the filter selects: 202 with the run (`status:
/// running`); 409 while another run of this process runs; 400 for an unknown judge, a bad
/// filter or a filter that selects no sample.
#[utoipa::path(post, path = "/v1/experiments/{name}/evals", params(("name" = String, Path, description = "the experiment's name")), request_body = EvalBody, responses((status = 202, description = "the run, `status: running`", body = Object)))]
pub async fn start(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
    caller: Option<axum::Extension<crate::keys::Caller>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (ab, e) = (cp.ab()?, cp.find(&name)?);
    let body: EvalBody = crate::body::parse_body(&body)?;
    let q = filter_of(&body)?;
    if let Some(j) = &body.judge {
        if cp.models.index(j).is_none() {
            return Err(ApiError::invalid_param(
                "judge",
                format!(
                    "the judge '{j}' is not a model this server serves (it serves {})",
                    cp.models.ids().join(", ")
                ),
            ));
        }
    }
    for v in &e.variants {
        cp.variant_model(v)?;
    }
    let (text, answered, rows) = match body.answers {
        Answers::Replay => {
            let (text, rows) = ab.store().dataset(&e.name, &q).await?;
            (text, vec![], rows)
        }
        Answers::Stored => stored_answers(ab.store(), &e, &q).await?,
    };
    if rows == 0 {
        return Err(ApiError::invalid_param(
            "filter",
            match body.answers {
                Answers::Replay => {
                    format!("the filter selects no sampled conversation of '{name}'")
                }
                Answers::Stored => format!(
                    "the filter selects no fan-out input of '{name}' that every variant answered"
                ),
            },
        ));
    }
    let Some(slot) = cp.eval_runs.take() else {
        return Err(ApiError::conflict(
            "An eval run of this server is running; start the next when it has finished (GET …/evals shows its status).",
        ));
    };
    let who = crate::keys::name_of(caller.as_deref());
    let request = serde_json::json!({"filter": body.filter, "judge": body.judge, "limit": q.limit, "answers": body.answers});
    let store = ab.store().clone();
    let id = store
        .start_eval_run(&e.name, &who, &request, rows as u64)
        .await?;
    let cfg = config(&e, body.judge.as_deref());
    spawn_run(store, cfg, (text, answered), cp.models.clone(), (id, slot));
    let run = ab.store().eval_run(&e.name, id).await?;
    Ok((StatusCode::ACCEPTED, Json(run)).into_response())
}

/// Runs eval run `id` in the background and writes its outcome; its slot is freed at the end.
fn spawn_run(
    store: abserve_ab::Store,
    cfg: EvalConfig,
    (text, answered): (String, Vec<ResultRow>),
    models: abserve_models::Registry,
    (id, slot): (i64, Slot),
) {
    // the eval's future is not `Send` for every lifetime (its judge's streams borrow the run),
    // so it is driven on a blocking thread of this runtime, as the CLI drives it on its own
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        // the run's heartbeat while it runs (a run whose server stops reads as interrupted)
        let beats = store.clone();
        let beating = handle.spawn(async move {
            let every = std::time::Duration::from_secs_f64(abserve_ab::EVAL_HEARTBEAT);
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = beats.beat_eval_run(id, super::unix_now()).await {
                    tracing::warn!("eval run {id}: its heartbeat was not written: {e}");
                }
            }
        });
        let ds = Dataset::from_jsonl(&text);
        let outcome = handle.block_on(run(cfg, ds, answered, models, id));
        let written = handle.block_on(match &outcome {
            Ok((summary, report)) => store.finish_eval_run(id, Ok((summary, report.as_str()))),
            Err(why) => store.finish_eval_run(id, Err(why.as_str())),
        });
        beating.abort();
        if let Err(e) = written {
            tracing::error!("eval run {id}: writing its outcome failed: {e}");
        }
        drop(slot);
    });
}

/// A run's working folder (its results log), removed when the run ends.
struct WorkDir(std::path::PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the eval in a temporary folder; answers its summary (JSON) and HTML report, or why it
/// failed.
async fn run(
    cfg: EvalConfig,
    mut ds: Dataset,
    answered: Vec<ResultRow>,
    models: abserve_models::Registry,
    id: i64,
) -> Result<(serde_json::Value, String), String> {
    abserve_eval::check(&cfg, &mut ds).map_err(|e| e.to_string())?;
    let dir = WorkDir(
        std::env::temp_dir().join(format!("abserve-eval-{id}-{:016x}", rand::random::<u64>())),
    );
    // stored answers go into the run's results log, so the eval asks for none of them again
    std::fs::create_dir_all(&dir.0).map_err(|e| format!("a working folder: {e}"))?;
    let log: String = answered
        .iter()
        .filter_map(|r| serde_json::to_string(r).ok())
        .map(|l| l + "\n")
        .collect();
    std::fs::write(dir.0.join("results.jsonl"), log)
        .map_err(|e| format!("the results log: {e}"))?;
    let target = Arc::new(Target::Engine(Arc::new(models)));
    let described = target.describe();
    let opts = Options {
        out: dir.0.clone(),
        fallback_concurrency: 4,
        concurrency: None,
        max_overloaded: 20,
    };
    let outcome = abserve_eval::run(&cfg, &ds, Source::Target(target), None, &opts)
        .await
        .map_err(|e| e.to_string())?;
    let facts = RunFacts {
        target: described,
        concurrency: outcome.capacity.concurrency,
        concurrency_source: outcome.capacity.source.clone(),
        wall_seconds: outcome.wall.as_secs_f64(),
        peak_memory_bytes: outcome.peak_memory,
    };
    let s = abserve_eval::summarize_run(&cfg, &ds, &outcome.results, &outcome.judgments, facts);
    let report = abserve_eval::report_html(&s, &ds, &outcome.results, &outcome.judgments)
        .map_err(|e| e.to_string())?;
    let summary = serde_json::to_value(&s).map_err(|e| e.to_string())?;
    Ok((summary, report))
}

/// The fan-out inputs among the samples `q` selects whose every variant answered (no error), as
/// a dataset (`{id: input id, input}` rows) and those answers as eval results; and how many rows.
async fn stored_answers(
    store: &abserve_ab::Store,
    e: &abserve_ab::Experiment,
    q: &SampleQuery,
) -> Result<(String, Vec<ResultRow>, usize), ApiError> {
    let picked = store.samples(&e.name, q).await?;
    let mut inputs: Vec<&str> = vec![];
    for s in &picked {
        if let Some(i) = s.input_id.as_deref().filter(|i| !inputs.contains(i)) {
            inputs.push(i);
        }
    }
    let (mut text, mut answered, mut rows) = (String::new(), vec![], 0);
    for input_id in inputs {
        let of_input = SampleQuery {
            input_id: Some(input_id.to_string()),
            limit: Some(500),
            ..Default::default()
        };
        let answers = store.samples(&e.name, &of_input).await?;
        let by: Vec<&abserve_ab::Sample> = e
            .variants
            .iter()
            .filter_map(|v| {
                answers
                    .iter()
                    .find(|s| s.variant == v.id && s.error.is_none())
            })
            .collect();
        if by.len() < e.variants.len() {
            continue;
        }
        rows += 1;
        let input = by[0]
            .request
            .get("input")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        text += &format!("{}\n", serde_json::json!({"id": input_id, "input": input}));
        answered.extend(by.iter().map(|s| result_row(s, input_id, input, rows)));
    }
    Ok((text, answered, rows))
}

/// A stored answer as the eval's result of (`row`, its variant).
fn result_row(s: &abserve_ab::Sample, row: &str, input: &str, line: usize) -> ResultRow {
    ResultRow {
        row: row.to_string(),
        line,
        variant: s.variant.clone(),
        input: input.to_string(),
        expected: None,
        output: Some(
            s.response
                .get("text")
                .and_then(|t| t.as_str())
                .unwrap_or_default()
                .to_string(),
        ),
        prompt_tokens: s.prompt_tokens.unwrap_or(0),
        completion_tokens: s.output_tokens.unwrap_or(0),
        ttft_ms: None,
        latency_ms: s.latency_ms,
        finish_reason: s.finish_reason.clone(),
        scores: Default::default(),
        score_errors: Default::default(),
        error: None,
        attempts: 1,
    }
}

#[derive(Deserialize)]
pub struct RunsQuery {
    limit: Option<u32>,
}

/// The experiment's eval runs, newest first (`limit`, default 20), without their reports.
#[utoipa::path(get, path = "/v1/experiments/{name}/evals", params(("name" = String, Path, description = "the experiment's name"), ("limit" = Option<u32>, Query, description = "at most this many (1-100, default 20)")), responses((status = 200, description = "`{object: list, data: [run]}`", body = Object)))]
pub async fn list(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<RunsQuery>,
) -> Result<Response, ApiError> {
    let (ab, e) = (cp.ab()?, cp.find(&name)?);
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid_param("limit", "between 1 and 100"));
    }
    let runs = ab.store().eval_runs(&e.name, limit).await?;
    Ok(Json(serde_json::json!({"object": "list", "data": runs})).into_response())
}

/// One eval run with its summary.
#[utoipa::path(get, path = "/v1/experiments/{name}/evals/{id}", params(("name" = String, Path, description = "the experiment's name"), ("id" = i64, Path, description = "the run's id")), responses((status = 200, description = "the run: `{id, experiment, at, who, request, rows, status, finished, error, summary}`", body = Object)))]
pub async fn one(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath((name, id)): UrlPath<(String, i64)>,
) -> Result<Response, ApiError> {
    let (ab, e) = (cp.ab()?, cp.find(&name)?);
    let run = ab.store().eval_run(&e.name, id).await?;
    let run = run.ok_or_else(|| ApiError::not_found(format!("'{name}' has no eval run {id}")))?;
    Ok(Json(run).into_response())
}

/// A finished eval run's HTML report (the one `abserve eval` writes).
#[utoipa::path(get, path = "/v1/experiments/{name}/evals/{id}/report", params(("name" = String, Path, description = "the experiment's name"), ("id" = i64, Path, description = "the run's id")), responses((status = 200, description = "the report", content_type = "text/html", body = String)))]
pub async fn report(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath((name, id)): UrlPath<(String, i64)>,
) -> Result<Response, ApiError> {
    let (ab, e) = (cp.ab()?, cp.find(&name)?);
    let html = ab.store().eval_report(&e.name, id).await?;
    let html = html.ok_or_else(|| {
        ApiError::not_found(format!(
            "'{name}' has no finished eval run {id} (GET …/evals/{id} shows its status)"
        ))
    })?;
    Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response())
}
