//! Sampled conversations on the server: the bounded queue between answered requests and the
//! store, the one writer that redacts and writes them, their reading and a unit's erasure over
//! HTTP, and the retention sweep (run by `periodic`).
//!
//! Invariants:
//! - a sample never delays its answer beyond a `try_send` into a queue of [`QUEUE`]: when the
//!   queue is full the sample is dropped and counted (`abserve_samples_total{outcome=
//!   "queue_full"}`), never the request; memory is bounded by the queue;
//! - redaction (`abserve_ab::Redactor`) runs in the writer before the store sees a sample, on
//!   every string of the request and the answer and on the error;
//! - the daily cap is counted per experiment per UTC day in the store (what every replica wrote
//!   today, read before each batch), so a restart or a second replica does not start the day
//!   over; samples over it are dropped and counted (`daily_cap`). Replicas writing at the same
//!   moment may pass it by at most one batch each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use abserve_ab::{Erased, Redactor, Sample, SampleQuery, SampleRules, Store};
use abserve_protocol::abserve::List;
use axum::extract::{Path as UrlPath, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::ControlPlane;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// Samples waiting for the writer, at most.
pub const QUEUE: usize = 1024;
/// Samples written in one transaction, at most.
const BATCH: usize = 64;

/// A sample on its way to the store, with its experiment's rules (for the cap and redaction).
pub struct Pending {
    pub sample: Sample,
    pub rules: Arc<SampleRules>,
}

/// The queue's sending side; the writer is started by the first sample offered (inside the
/// runtime), so a control plane built outside one has none running until it needs it.
pub struct SampleQueue {
    tx: mpsc::Sender<Pending>,
    idle: Mutex<Option<(mpsc::Receiver<Pending>, Store)>>,
    metrics: Arc<Metrics>,
}

impl SampleQueue {
    pub fn new(store: Store, metrics: Arc<Metrics>) -> SampleQueue {
        let (tx, rx) = mpsc::channel(QUEUE);
        SampleQueue {
            tx,
            idle: Mutex::new(Some((rx, store))),
            metrics,
        }
    }

    /// Queues a sample, or drops it (counted) when the queue is full.
    pub fn offer(&self, p: Pending) {
        if let Some((rx, store)) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).take() {
            tokio::spawn(writer(rx, store, self.metrics.clone()));
        }
        if self.tx.try_send(p).is_err() {
            self.metrics
                .samples
                .with_label_values(&["queue_full"])
                .inc();
        }
    }
}

/// Per experiment: the UTC day and the samples kept that day; the compiled redaction of its
/// patterns.
#[derive(Default)]
struct WriterState {
    days: HashMap<String, (String, u64)>,
    redactors: HashMap<String, (Vec<String>, Redactor)>,
}

impl WriterState {
    /// Sets today's count of each capped experiment in `batch` to what the store holds from
    /// today (every replica's); on a store error the count kept here stays.
    async fn count_stored(
        &mut self,
        store: &Store,
        batch: &[Pending],
        today: &str,
        now: std::time::SystemTime,
    ) {
        let secs = now
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let day_start = (secs - secs % 86_400) as f64;
        let mut seen: Vec<&str> = vec![];
        for p in batch.iter().filter(|p| p.rules.daily_cap.is_some()) {
            let e = p.sample.experiment.as_str();
            if seen.contains(&e) {
                continue;
            }
            seen.push(e);
            match store.samples_since(e, day_start).await {
                Ok(n) => {
                    self.days.insert(e.to_string(), (today.to_string(), n));
                }
                Err(err) => tracing::warn!("today's samples of '{e}' could not be counted: {err}"),
            }
        }
    }

    /// The sample redacted, or `None` when its experiment's cap for today is reached.
    fn admit(&mut self, p: Pending, today: &str) -> Option<Sample> {
        let Pending { mut sample, rules } = p;
        let day = self.days.entry(sample.experiment.clone()).or_default();
        if day.0 != today {
            *day = (today.to_string(), 0);
        }
        if rules.daily_cap.is_some_and(|cap| day.1 >= cap) {
            return None;
        }
        day.1 += 1;
        let fresh = match self.redactors.get(&sample.experiment) {
            Some((patterns, _)) => *patterns != rules.redact,
            None => true,
        };
        if fresh {
            self.redactors.insert(
                sample.experiment.clone(),
                (rules.redact.clone(), rules.redactor()),
            );
        }
        let r = &self.redactors[&sample.experiment].1;
        r.json(&mut sample.request);
        r.json(&mut sample.response);
        sample.error = sample.error.map(|e| r.text(&e));
        Some(sample)
    }
}

async fn writer(mut rx: mpsc::Receiver<Pending>, store: Store, metrics: Arc<Metrics>) {
    let mut st = WriterState::default();
    let count = |outcome: &str, n: usize| {
        metrics
            .samples
            .with_label_values(&[outcome])
            .inc_by(n as u64)
    };
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let now = std::time::SystemTime::now();
        let today = abserve_ab::utc_day(now);
        st.count_stored(&store, &batch, &today, now).await;
        let n = batch.len();
        // redaction is CPU work: off the async threads
        let (st_back, out) = tokio::task::spawn_blocking(move || {
            let out: Vec<Sample> = batch
                .into_iter()
                .filter_map(|p| st.admit(p, &today))
                .collect();
            (st, out)
        })
        .await
        .unwrap_or_else(|_| (WriterState::default(), vec![]));
        st = st_back;
        count("daily_cap", n - out.len());
        if out.is_empty() {
            continue;
        }
        match store.record_samples(&out).await {
            Ok(()) => count("written", out.len()),
            Err(e) => {
                count("store_error", out.len());
                metrics.store_error("samples");
                tracing::error!("{} sampled conversations were not stored: {e}", out.len());
            }
        }
    }
}

/// The samples of an experiment, newest first, filtered (`variant`, `error`, `finish_reason`,
/// `q` text search, `unit`, `input_id`; `before` an id for the next page; `limit` 1-500).
#[utoipa::path(get, path = "/v1/experiments/{name}/samples", params(("name" = String, Path, description = "the experiment's name")), responses((status = 200, description = "`{object: list, data: [sample]}`", body = Object)))]
pub async fn list(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<SampleQuery>,
) -> Result<Response, ApiError> {
    if !(1..=500).contains(&q.limit.unwrap_or(50)) {
        return Err(ApiError::invalid_param(
            "limit",
            "limit must be between 1 and 500",
        ));
    }
    let (ab, e) = (cp.ab()?, cp.find(&name)?);
    let data = ab.store().samples(&e.name, &q).await?;
    Ok(Json(List::new(data)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EraseQuery {
    /// Only this experiment's data (default: every experiment's).
    experiment: Option<String>,
}

/// Erases a unit: its samples, exposures and events (of one experiment or all), for an erasure
/// request. Answers what was deleted.
#[utoipa::path(delete, path = "/v1/units/{unit}", params(("unit" = String, Path, description = "the unit (the value of the experiments' hash attribute)")), responses((status = 200, description = "`{unit, samples, exposures, events}`: rows deleted", body = Object)))]
pub async fn erase(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(unit): UrlPath<String>,
    Query(q): Query<EraseQuery>,
) -> Result<Response, ApiError> {
    let ab = cp.ab()?;
    if let Some(name) = &q.experiment {
        cp.find(name)?;
    }
    let Erased {
        samples,
        exposures,
        events,
        eval_runs,
    } = ab
        .store()
        .erase_unit(&unit, q.experiment.as_deref())
        .await?;
    Ok(Json(serde_json::json!({"unit": unit, "samples": samples, "exposures": exposures, "events": events, "eval_runs": eval_runs})).into_response())
}

impl ControlPlane {
    /// Deletes the samples every experiment's retention has passed (`now`: seconds since the
    /// epoch; a test passes a later one). How many were deleted.
    pub async fn sweep_samples(&self, now: f64) -> u64 {
        let Some(ab) = &self.ab else { return 0 };
        let mut n = 0;
        for e in ab.list() {
            let Some(rules) = &e.samples else { continue };
            let before = now - rules.retention_days * 86_400.0;
            match ab.store().delete_samples_before(&e.name, before).await {
                Ok(k) => n += k,
                Err(err) => tracing::warn!("the retention sweep of '{}' failed: {err}", e.name),
            }
        }
        n
    }
}

/// The samples (the same filters, every page; `limit` caps the rows, default all) as an
/// `abserve eval` dataset: JSON lines of `{id, input, unit, variant, sampled_answer}` — the same
/// inputs, replayed over new variants.
#[utoipa::path(get, path = "/v1/experiments/{name}/samples/export", params(("name" = String, Path, description = "the experiment's name")), responses((status = 200, description = "JSON lines, one dataset row per sample", content_type = "application/x-ndjson", body = String)))]
pub async fn export(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<SampleQuery>,
) -> Result<Response, ApiError> {
    let (ab, e) = (cp.ab()?, cp.find(&name)?);
    let (out, _) = ab.store().dataset(&e.name, &q).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        out,
    )
        .into_response())
}

/// A reviewer's rating of a sample: any of thumbs, a 1-5 score, one of the experiment's labels,
/// a comment.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReviewBody {
    thumbs: Option<bool>,
    score: Option<u8>,
    label: Option<String>,
    comment: Option<String>,
}

/// The longest review comment, in characters.
const MAX_COMMENT: usize = 2000;

/// The events a review gives its sample's unit: `review_thumbs_up` (1 or 0), `review_score`
/// (1-5), `review_label_<label>` (1).
fn review_events(unit: &str, b: &ReviewBody) -> Vec<abserve_ab::OutcomeEvent> {
    let event = |metric: String, value: f64| abserve_ab::OutcomeEvent {
        unit: unit.to_string(),
        metric,
        value,
        timestamp: None,
    };
    let mut out = vec![];
    if let Some(t) = b.thumbs {
        out.push(event("review_thumbs_up".into(), if t { 1.0 } else { 0.0 }));
    }
    if let Some(s) = b.score {
        out.push(event("review_score".into(), f64::from(s)));
    }
    if let Some(l) = &b.label {
        out.push(event(format!("review_label_{l}"), 1.0));
    }
    out
}

/// Rates a sample: the fields given change its review (the others stay; with the reviewer's key
/// name and the time) and, for a sample of a unit, are recorded as outcome events of that unit
/// (`review_thumbs_up`, `review_score`, `review_label_<label>`), so ratings flow into results,
/// guardrails and bandits as any metric does. A changed rating is a new event (a unit's
/// metric is the mean of its events).
#[utoipa::path(post, path = "/v1/experiments/{name}/samples/{id}/review", params(("name" = String, Path, description = "the experiment's name"), ("id" = i64, Path, description = "the sample's id")), request_body = ReviewBody, responses((status = 200, description = "the sample with its review", body = Object)))]
pub async fn review(
    State(cp): State<Arc<ControlPlane>>,
    UrlPath((name, id)): UrlPath<(String, i64)>,
    caller: Option<axum::Extension<crate::keys::Caller>>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let (ab, e) = (cp.ab()?, cp.find(&name)?);
    let b: ReviewBody = crate::body::parse_body(&body)?;
    if b.thumbs.is_none() && b.score.is_none() && b.label.is_none() && b.comment.is_none() {
        return Err(ApiError::bad_request(
            "A review needs thumbs, score, label or comment.",
        ));
    }
    if b.score.is_some_and(|s| !(1..=5).contains(&s)) {
        return Err(ApiError::invalid_param("score", "score must be 1 to 5"));
    }
    let labels = e
        .samples
        .as_ref()
        .map(|s| s.labels.clone())
        .unwrap_or_default();
    if let Some(l) = b.label.as_ref().filter(|l| !labels.contains(l)) {
        return Err(ApiError::invalid_param(
            "label",
            format!(
                "'{l}' is not one of this experiment's labels ({})",
                labels.join(", ")
            ),
        ));
    }
    if b.comment
        .as_ref()
        .is_some_and(|c| c.chars().count() > MAX_COMMENT)
    {
        return Err(ApiError::invalid_param(
            "comment",
            format!("a comment has at most {MAX_COMMENT} characters"),
        ));
    }
    let by = crate::keys::name_of(caller.as_deref());
    let now = super::unix_now();
    let missing = || ApiError::not_found(format!("Experiment '{name}' has no sample {id}."));
    // the fields given change, the others stay (merged by the store in one statement)
    let mut review = serde_json::json!({"by": by, "at": now});
    let given = serde_json::json!({"thumbs": b.thumbs, "score": b.score, "label": b.label, "comment": b.comment});
    for (k, v) in given
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| !v.is_null())
    {
        review[k] = v.clone();
    }
    let sample = ab
        .store()
        .review_sample(&e.name, id, &review)
        .await?
        .ok_or_else(missing)?;
    let events = review_events(&sample.unit, &b);
    if !sample.unit.is_empty() && !events.is_empty() {
        ab.store()
            .record_events(&e.name, None, &events)
            .await
            .inspect_err(|_| cp.metrics.store_error("events"))?;
    }
    Ok(Json(sample).into_response())
}
