//! `abserve loadtest`: drives any OpenAI-compatible server with a closed loop (C clients, each
//! sending its next request when the last one ends) or an open loop (Poisson arrivals at a
//! rate), measures throughput, TTFT, latency and inter-token latency, classifies every failure,
//! and for an abserve target follows memory and KV use from /metrics. `--assert-no-oom` turns the
//! run into the no-OOM check of CI.
//!
//! `driver` sends the load, `client` classifies each answer, `scrape` follows `/metrics`,
//! `report` turns records and samples into the report; `dist` reads length distributions.

mod client;
mod dist;
mod driver;
mod error;
mod report;
mod scrape;

pub use client::{mentions_oom, Class, Record};
pub use dist::Dist;
pub use driver::{run, Config, Mode, Workload};
pub use error::LoadError;
pub use report::Report;
pub use scrape::Sample;
