//! The experiments control plane: definitions (CRUD, checked against the registry's models),
//! routing of units to variants, exposures, outcome events, results, the periodic work
//! (guardrails, bandits, sample ratio), and the dashboard. It runs no model: the inference API
//! (`crate::inference`) does, and reaches this room through one small interface —
//! [`ControlPlane::route`] (a request for `experiment:NAME` → its variant, as a [`Routed`])
//! and [`ControlPlane::record`] (the outcome of a routed request, as an exposure).
//!
//! - `live`: [`AbState`], the experiments this replica routes and their store;
//! - `routing`: assignment of a unit (sticky for bandits, stopped variants served the control)
//!   and the exposure recorder;
//! - `spend`: daily spend caps of variants' fan-out, held before and settled after each answer;
//! - `check`: a variant checked as the request it will produce, by the model it names;
//! - `routes`: the HTTP routes of definitions, events and results;
//! - `periodic`: the one task that reads each experiment's results once per pass;
//! - `dashboard`: the page and the JSON it reads;
//! - `samples`: sampled conversations — the bounded queue, the redacting writer, reading,
//!   erasure of a unit, the retention sweep;
//! - `audit`: the audit log (admin actions, reads of stored conversations), written and read.

pub(crate) mod audit;
mod check;
pub(crate) mod dashboard;
pub(crate) mod evals;
mod live;
mod periodic;
pub(crate) mod routes;
mod routing;
pub(crate) mod samples;
mod spend;

use std::sync::Arc;
use std::time::{Duration, Instant};

use abserve_ab::Experiment;
use abserve_models::Registry;
use axum::routing::get;
use axum::Router;

pub use check::variant as check_variant;
pub use live::AbState;
pub use routing::{Answer, Routed};
pub use spend::Held;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::prep::Prep;

/// The control plane's state: the experiments (when the server has a store) and what it reads
/// of the rest of the server.
pub struct ControlPlane {
    /// The experiments this replica routes and their store; `None` without a data directory
    /// (every experiments route then answers 404).
    pub ab: Option<AbState>,
    /// The models variants may name (to check a definition, to keep its adapters loaded).
    pub models: Registry,
    pub metrics: Arc<Metrics>,
    /// How often the periodic work runs (`--guardrail-interval`).
    pub interval: Duration,
    /// The dashboard asks for a key first.
    pub auth_required: bool,
    pub started: Instant,
    /// Sampled conversations on their way to the store (with a store).
    pub(crate) samples: Option<samples::SampleQueue>,
    /// The eval run started from the review page, while one runs.
    eval_runs: evals::Runs,
    prep: Arc<Prep>,
}

impl ControlPlane {
    pub(crate) fn new(
        ab: Option<AbState>,
        models: Registry,
        metrics: Arc<Metrics>,
        interval: Duration,
        auth_required: bool,
        prep: Arc<Prep>,
    ) -> Arc<ControlPlane> {
        let samples = ab
            .as_ref()
            .map(|ab| samples::SampleQueue::new(ab.store().clone(), metrics.clone()));
        let cp = Arc::new(ControlPlane {
            samples,
            eval_runs: evals::Runs::default(),
            ab,
            models,
            metrics,
            interval,
            auth_required,
            started: Instant::now(),
            prep,
        });
        cp.pin_adapters();
        cp
    }

    /// The experiments, or a 404 when this server has none.
    pub fn ab(&self) -> Result<&AbState, ApiError> {
        self.ab
            .as_ref()
            .ok_or_else(|| ApiError::not_found("Experiments are not enabled on this server."))
    }

    /// The named experiment, or a 404.
    pub fn find(&self, name: &str) -> Result<Experiment, ApiError> {
        self.ab()?
            .get(name)
            .ok_or_else(|| ApiError::not_found(format!("No experiment named '{name}'.")))
    }

    /// The position in the registry of the model a variant generates with (`model = "ID"`;
    /// the default without one), or a 400 naming `variants.ID.model` for a model not served.
    pub fn variant_model(&self, v: &abserve_ab::Variant) -> Result<usize, ApiError> {
        let Some(m) = &v.model else { return Ok(0) };
        self.models.index(m).ok_or_else(|| {
            ApiError::invalid_param(
                &format!("variants.{}.model", v.id),
                format!(
                    "variant '{}' names the model '{m}', which this server does not serve (it serves {})",
                    v.id,
                    self.models.ids().join(", ")
                ),
            )
        })
    }

    /// Runs CPU-bound work of a request on the blocking pool (see [`Prep`]).
    pub async fn off_thread<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&ControlPlane) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let cp = self.clone();
        self.prep.run(move || f(&cp)).await
    }

    /// Keeps the adapters that experiments' active variants name loaded while they name them
    /// (the default model's budget asks at each admission that needs room; a weak reference,
    /// so the budget does not keep the control plane alive).
    fn pin_adapters(self: &Arc<Self>) {
        let Some(budget) = self
            .models
            .default_entry()
            .tokens()
            .and_then(|t| t.adapters())
        else {
            return;
        };
        let weak = Arc::downgrade(self);
        budget.pin_with(Box::new(move || {
            let Some(cp) = weak.upgrade() else {
                return vec![];
            };
            let Some(ab) = &cp.ab else { return vec![] };
            let mut names = vec![];
            for e in ab.list() {
                for v in e.variants.iter().filter(|v| v.stopped.is_none()) {
                    if cp.variant_model(v).is_ok_and(|m| m == 0) {
                        let s = v.sampling();
                        names.extend(s.adapters.unwrap_or_default().into_iter().map(|a| a.path));
                    }
                }
            }
            names
        }));
    }

    /// Starts the background work: keeping the experiments this replica routes in step with
    /// the store (`live`), and the periodic work (`periodic`).
    pub fn spawn(self: &Arc<Self>) {
        let cp = self.clone();
        tokio::spawn(async move {
            if let Some(ab) = cp.ab.as_ref() {
                ab.sync().await;
            }
        });
        self.spawn_periodic();
    }
}

/// Now, in seconds since the Unix epoch (what the store and the statistics take as time).
pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The control plane's routes under `/v1` (definitions, events, results, the dashboard's data).
pub fn api(cp: Arc<ControlPlane>) -> Router {
    use routes::*;
    Router::new()
        .route("/experiments", get(list).post(create))
        .route("/experiments/{name}", get(get_one).put(put).delete(delete))
        .route("/experiments/{name}/events", axum::routing::post(events))
        .route("/experiments/{name}/results", get(results))
        .route("/experiments/{name}/history", get(dashboard::history))
        .route("/experiments/{name}/exposures", get(dashboard::exposures))
        .route("/engine", get(dashboard::engine))
        .route("/audit", get(audit::audit_log))
        .route("/experiments/{name}/samples", get(samples::list))
        .route("/experiments/{name}/samples/export", get(samples::export))
        .route(
            "/experiments/{name}/samples/{id}/review",
            axum::routing::post(samples::review),
        )
        .route(
            "/experiments/{name}/evals",
            get(evals::list).post(evals::start),
        )
        .route("/experiments/{name}/evals/{id}", get(evals::one))
        .route("/experiments/{name}/evals/{id}/report", get(evals::report))
        .route("/units/{unit}", axum::routing::delete(samples::erase))
        .with_state(cp)
}

/// The dashboard's page and assets (no data: served without a key).
pub fn pages(cp: Arc<ControlPlane>) -> Router {
    Router::new()
        .route("/", get(dashboard::index))
        .route("/dashboard/app.js", get(dashboard::script))
        .route("/dashboard/review.js", get(dashboard::review_script))
        .route("/dashboard/app.css", get(dashboard::style))
        .route("/dashboard/config.json", get(dashboard::config))
        .with_state(cp)
}
