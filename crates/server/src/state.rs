//! The server's shared state: the model registry, metrics, settings, shutdown and readiness,
//! the drain rate Retry-After is computed from, and the two rooms' meeting point (the
//! experiments control plane the inference API routes through).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abserve_models::Registry;

use crate::error::ApiError;
use crate::experiments::{AbState, ControlPlane};
use crate::metrics::Metrics;
use crate::prep::Prep;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub queue_timeout: Duration,
    /// The keys callers present under `/v1` and their roles (`--api-key`, `--keys`); open
    /// without either.
    pub keys: Arc<crate::keys::Keys>,
    pub body_limit: usize,
    /// Longest prompt accepted, in tokens (besides the context limit).
    pub max_prompt_tokens: usize,
    pub ready_cache: Duration,
    pub drain_timeout: Duration,
    /// A connection must send its request head within this (slow-loris clients are closed).
    pub header_read_timeout: Duration,
    /// Origins allowed by CORS (`--cors-origin`); none: no CORS headers.
    pub cors_origins: Vec<String>,
    /// How often the experiments' periodic work runs (guardrails, bandits, sample ratio:
    /// `experiments/periodic.rs`).
    pub guardrail_interval: Duration,
}

pub struct AppState {
    /// Every model this server serves, by id, the default first (`--model`, repeated; a fake
    /// engine in the server's unit tests): a request or a variant names one, and it runs there.
    pub models: Registry,
    pub metrics: Arc<Metrics>,
    pub config: ServerConfig,
    pub shutting_down: AtomicBool,
    /// Requests completed per second, smoothed (×1000), for Retry-After.
    drain_rate_milli: AtomicU64,
    pub ready:
        tokio::sync::Mutex<Option<(Instant, Result<abserve_protocol::abserve::Ready, String>)>>,
    /// The experiments control plane: the inference API asks it to route a request for
    /// `experiment:NAME` and records the outcome through it.
    pub experiments: Arc<ControlPlane>,
    /// The blocking pool's share for request preparation (shared with the control plane).
    prep: Arc<Prep>,
}

impl AppState {
    /// A server of the models in `models` (the default one first).
    pub fn new(
        models: Registry,
        metrics: Arc<Metrics>,
        config: ServerConfig,
        ab: Option<AbState>,
    ) -> Arc<Self> {
        // every model of the registry has its `model`-labelled series
        metrics.add_models(&models);
        let prep = Arc::new(Prep::new());
        let experiments = ControlPlane::new(
            ab,
            models.clone(),
            metrics.clone(),
            config.guardrail_interval,
            config.keys.required(),
            prep.clone(),
        );
        Arc::new(AppState {
            models,
            metrics,
            config,
            shutting_down: AtomicBool::new(false),
            drain_rate_milli: AtomicU64::new(0),
            ready: tokio::sync::Mutex::new(None),
            experiments,
            prep,
        })
    }

    /// Runs CPU-bound work of a request on the blocking pool (see [`Prep`]).
    pub async fn off_thread<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let st = self.clone();
        self.prep.run(move || f(&st)).await
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Samples completions once a second; Retry-After divides the queue by this rate.
    pub fn spawn_drain_meter(self: &Arc<Self>) {
        let st = self.clone();
        tokio::spawn(async move {
            let completed =
                |st: &AppState| st.models.iter().map(|m| m.stats().completed).sum::<u64>();
            let mut last = completed(&st);
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let now = completed(&st);
                let rate = (now - last) as f64;
                last = now;
                let old = st.drain_rate_milli.load(Ordering::Relaxed) as f64 / 1000.0;
                let ewma = if old == 0.0 {
                    rate
                } else {
                    0.7 * old + 0.3 * rate
                };
                st.drain_rate_milli
                    .store((ewma * 1000.0) as u64, Ordering::Relaxed);
            }
        });
    }

    /// Seconds until the queue has room, from the current drain rate.
    pub fn retry_after(&self) -> u64 {
        let rate = self.drain_rate_milli.load(Ordering::Relaxed) as f64 / 1000.0;
        let ahead = self
            .models
            .iter()
            .map(|m| m.stats())
            .map(|s| s.waiting + s.running)
            .sum::<u64>() as f64
            + 1.0;
        if rate <= 0.01 {
            return 2;
        }
        (ahead / rate).ceil().clamp(1.0, 60.0) as u64
    }
}
