//! `abserve loadtest`: load on any OpenAI-compatible server, with the no-OOM check CI runs.

use std::time::Duration;

use abserve_loadtest::{Config, Dist, Mode, Workload};
use clap::Args;

#[derive(Args, Debug)]
pub struct LoadtestArgs {
    /// Server root or its /v1 URL.
    #[arg(long)]
    pub url: String,
    /// Send `model = experiment:NAME` with a fresh unit per request (the server assigns variants).
    #[arg(long, conflicts_with = "variants")]
    pub experiment: Option<String>,
    /// N prompt variants (distinct system prompts) taking turns.
    #[arg(long, default_value_t = 1)]
    pub variants: u32,
    /// Closed loop: this many clients, each sending its next request when the last ends.
    #[arg(long, conflicts_with = "rate")]
    pub concurrency: Option<usize>,
    /// Open loop: requests per second, Poisson arrivals.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop sending after this many seconds (in-flight requests finish).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stop after this many requests.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Prompt length in words (≈ tokens): N, uniform:A-B, normal:MEAN,SD, choice:A,B,...
    #[arg(long, default_value = "uniform:32-256")]
    pub prompt_tokens: Dist,
    /// max_tokens of each request, same forms.
    #[arg(long, default_value = "uniform:16-128")]
    pub max_tokens: Dist,
    /// Stream answers (gives TTFT and inter-token latency).
    #[arg(long)]
    pub stream: bool,
    /// Ask the server to generate max_tokens regardless of end-of-text (abserve, vLLM, llama.cpp).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Model name (default: the first of /v1/models).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Environment variable holding the API key.
    #[arg(long, default_value = "OPENAI_API_KEY")]
    pub api_key_env: String,
    /// Seconds before a request counts as timed out.
    #[arg(long, default_value_t = 120.0)]
    pub timeout: f64,
    /// Seconds to wait after the load for the server to go idle.
    #[arg(long, default_value_t = 30.0)]
    pub settle: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Exit 1 on any 5xx, out-of-memory text, timeout, lost connection, or memory above --max-memory.
    #[arg(long)]
    pub assert_no_oom: bool,
    /// Bound on the server's peak resident memory in bytes (abserve targets).
    #[arg(long)]
    pub max_memory: Option<f64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: LoadtestArgs) -> anyhow::Result<i32> {
    let mode = match (a.concurrency, a.rate) {
        (Some(c), None) if c > 0 => Mode::Closed { concurrency: c },
        (None, Some(r)) => Mode::Open { rate: r },
        _ => anyhow::bail!("give --concurrency C (closed loop, C ≥ 1) or --rate R (open loop)"),
    };
    let workload = match &a.experiment {
        Some(e) => Workload::Experiment(e.clone()),
        None if a.variants >= 1 => Workload::Variants(a.variants),
        None => anyhow::bail!("--variants must be at least 1"),
    };
    for (name, v) in [
        ("--timeout", Some(a.timeout)),
        ("--settle", Some(a.settle)),
        ("--duration", a.duration),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v >= 0.0) {
                anyhow::bail!("{name} must be a number of seconds ≥ 0, got {v}");
            }
        }
    }
    let cfg = Config {
        url: a.url.clone(),
        key: std::env::var(&a.api_key_env).ok().filter(|k| !k.is_empty()),
        model: a.model_name.clone(),
        workload,
        mode,
        duration: a.duration.map(Duration::from_secs_f64),
        requests: a.requests,
        prompt_tokens: a.prompt_tokens.clone(),
        max_tokens: a.max_tokens.clone(),
        stream: a.stream,
        ignore_eos: a.ignore_eos,
        timeout: Duration::from_secs_f64(a.timeout.max(0.001)),
        settle: Duration::from_secs_f64(a.settle),
        seed: a.seed,
        max_inflight: 4096,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut report = rt.block_on(abserve_loadtest::run(cfg))?;
    if a.assert_no_oom || a.max_memory.is_some() {
        report.check_no_oom(a.max_memory);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.table());
    }
    if a.assert_no_oom || a.max_memory.is_some() {
        if report.failures.is_empty() {
            eprintln!("loadtest: no OOM: no 5xx, no out-of-memory answers, no timeouts or lost connections{}", if a.max_memory.is_some() { ", memory within the bound" } else { "" });
        } else {
            for f in &report.failures {
                eprintln!("loadtest: FAILED: {f}");
            }
            return Ok(1);
        }
    }
    Ok(0)
}
