//! The models of a process (its registry) and their metrics, started the same way by `abserve serve` and
//! `abserve worker` (whose `--listen` serves the same `/health`, `/ready` and `/metrics`).

use std::sync::Arc;
use std::time::Duration;

use abserve_engine::models::ModelConfig;
use abserve_engine::{Engine, EngineConfig};
use abserve_models::Registry;

use crate::metrics::Metrics;
use crate::state::ServerConfig;

/// Plans, loads the model once and starts the engine thread, with every engine step observed
/// by the metrics' step histogram.
pub fn start_engine(cfg: EngineConfig) -> anyhow::Result<(Engine, Arc<Metrics>)> {
    let step_hist = Metrics::engine_step_histogram()?;
    let observer = step_hist.clone();
    let engine = Engine::start_with_observer(
        cfg,
        Some(Arc::new(move |d: Duration| {
            observer.observe(d.as_secs_f64())
        })),
    )?;
    let metrics = Metrics::new(
        engine.plan(),
        engine.stats_handle(),
        step_hist,
        engine.device(),
    )?;
    Ok((engine, metrics))
}

/// Starts every model of a process (`--model ID=FILE`, repeated): all their plans are checked
/// before the first loads (`models.rs`), then each is loaded once, the first with the metrics'
/// step histogram. Answers the registry (the default model first) and the metrics.
pub fn start_models(models: Vec<ModelConfig>) -> anyhow::Result<(Registry, Arc<Metrics>)> {
    abserve_engine::models::check_all(&models)?;
    let mut models = models.into_iter();
    let first = models
        .next()
        .ok_or_else(|| anyhow::anyhow!("no model to serve"))?;
    let (engine, metrics) = start_engine(first.config)?;
    let mut engines = vec![(first.id, Arc::new(engine))];
    for m in models {
        engines.push((m.id, Arc::new(Engine::start(m.config)?)));
    }
    if let Some(budget) = abserve_engine::prepare::Tokenizer::adapters(&*engines[0].1) {
        crate::adapter_metrics::add(&metrics, budget.clone(), engines[0].1.stats_handle())?;
    }
    let registry = Registry::local(engines).map_err(anyhow::Error::msg)?;
    Ok((registry, metrics))
}

impl ServerConfig {
    /// What the operations routes read in a process that serves no API (`abserve worker`): the
    /// readiness cache and the time limits; no API key, no request bodies.
    pub fn operations() -> ServerConfig {
        ServerConfig {
            queue_timeout: Duration::from_secs(30),
            keys: std::sync::Arc::new(crate::keys::Keys::open()),
            body_limit: 0,
            max_prompt_tokens: 0,
            ready_cache: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(1),
            header_read_timeout: Duration::from_secs(10),
            cors_origins: vec![],
            guardrail_interval: Duration::from_secs(10),
        }
    }
}
