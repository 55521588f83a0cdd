//! abserve's HTTP server, in two rooms over one model registry (`abserve_models::Registry`):
//!
//! - `inference`: the OpenAI API (chat completions, completions, models) and the fan-out —
//!   validation, admission with back-pressure, whole and streamed answers;
//! - `experiments`: the control plane — definitions, routing of units, exposures, events,
//!   results, the periodic work (guardrails, bandits, sample ratio) and the dashboard. The
//!   inference API reaches it through one interface: route a request to a variant, record the
//!   outcome.
//!
//! Around them: `state` (the shared state: registry, metrics, settings, shutdown, readiness
//! cache, drain rate), `routes` (the router: both rooms under `/v1` behind the API key, the
//! pages, the operations routes), `health` (`/health`, `/ready`, `/metrics`), `metrics` and
//! `model_metrics` (Prometheus), `serve` (listening, draining), `start` (the models of a
//! process), `body` (a JSON body parsed once), `prep` (the blocking pool's share for
//! preparation), `keys` (API keys and their roles), `auth` (who may call which route; the audit
//! log), `error` (OpenAI's error shape), `openapi`. No model code here. See
//! docs/architecture.md.

mod adapter_metrics;
mod auth;
mod body;
mod error;
mod experiments;
mod health;
mod inference;
mod keys;
mod metrics;
mod model_metrics;
mod openapi;
mod prep;
mod routes;
mod serve;
mod start;
mod state;

#[cfg(test)]
mod tests;

pub use error::ApiError;
pub use experiments::{AbState, ControlPlane};
pub use keys::{Caller, Keys};
pub use metrics::Metrics;
pub use routes::{ops_router, router};
pub use serve::{serve, serve_ops};
pub use start::{start_engine, start_models};
pub use state::{AppState, ServerConfig};
