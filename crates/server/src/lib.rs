//! abserve's HTTP server: an OpenAI-compatible API over the one shared engine, with
//! back-pressure, health, readiness and Prometheus metrics. No model code here.
//!
//! Request path: [`routes`](crate::routes) → validation (`validate`) → routing to an experiment's
//! variant (`experiments`) → admission (`state`) → the engine → a whole or streamed response
//! (`api`) → the exposure. A server may serve several models (`state::OtherModel`): a request or
//! a variant names one, and its engine takes it. See docs/architecture.md. The experiment dashboard (`dashboard`) is
//! served at `/` from assets embedded in the binary.

mod abstate;
mod adapter_metrics;
mod api;
mod auth;
mod bandits;
mod body_rules;
mod dashboard;
mod engine_api;
mod error;
mod experiments;
mod guardrails;
mod health;
mod metrics;
mod model_metrics;
mod openapi;
mod respond;
mod routes;
mod serve;
mod start;
mod state;
mod tool_calls;
mod valid;
mod validate;

#[cfg(test)]
mod tests;

pub use abstate::AbState;
pub use engine_api::EngineApi;
pub use error::ApiError;
pub use metrics::Metrics;
pub use routes::{ops_router, router};
pub use serve::{serve, serve_ops};
pub use start::{other_models, start_engine, start_models};
pub use state::{AppState, OtherModel, ServerConfig};
