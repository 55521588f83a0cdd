//! `abserve loadtest`: drives any OpenAI-compatible server with a closed loop (C clients, each
//! sending its next request when the last one ends) or an open loop (Poisson arrivals at a
//! rate), measures throughput, TTFT, latency and inter-token latency, classifies every failure,
//! and for an abserve target follows memory and KV use from /metrics. `--assert-no-oom` turns the
//! run into the no-OOM check of CI.

pub mod client;
pub mod dist;
pub mod driver;
pub mod report;
pub mod scrape;
