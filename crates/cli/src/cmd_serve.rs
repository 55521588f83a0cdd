//! `abserve serve`: the OpenAI-compatible HTTP server over one shared engine.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use abserve_engine::QueueLimit;
use abserve_server::{AbState, AppState, Keys, ServerConfig};
use clap::Args;

use crate::args::ModelArgs;
use crate::upstreams::UpstreamArgs;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub upstreams: UpstreamArgs,
    /// Address to bind (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests allowed to wait for admission; beyond it: 429 [default: 2 × sequence slots].
    #[arg(long)]
    pub max_queue: Option<usize>,
    /// Seconds a request may wait for admission before a 429.
    #[arg(long, default_value_t = 30.0)]
    pub queue_timeout: f64,
    /// Require `Authorization: Bearer KEY` on /v1/*: an admin key (see --keys for roles).
    #[arg(long, env = "ABSERVE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Keys with roles (TOML, `[[key]]` tables with `role` = inference, reviewer or admin, and
    /// `key` or its `sha256`; optional `name`, `service_tier`), re-read when the file changes
    /// or on SIGHUP. See docs/keys.md.
    #[arg(long)]
    pub keys: Option<std::path::PathBuf>,
    /// Name clients use in `model` [default: the GGUF file name without extension].
    #[arg(long)]
    pub model_id: Option<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub body_limit: usize,
    /// Longest prompt in tokens [default: context − 1].
    #[arg(long)]
    pub max_prompt_tokens: Option<usize>,
    /// Seconds running requests get to finish after SIGTERM; then what is still open is cut and
    /// the process exits 0.
    #[arg(long, default_value_t = 30.0)]
    pub drain_timeout: f64,
    /// Seconds a connection has to send its request head before it is closed.
    #[arg(long, default_value_t = 10.0)]
    pub header_read_timeout: f64,
    /// Origin allowed to call the API from a browser (CORS), e.g. a dashboard's
    /// `https://ab.example.com`; repeat for several. Default: none (no CORS headers).
    #[arg(long = "cors-origin")]
    pub cors_origins: Vec<String>,
    /// Experiments file (TOML, `[[experiment]]` tables) loaded into the store at start.
    #[arg(long)]
    pub experiments: Option<std::path::PathBuf>,
    /// Keep experiments the store already has when the `--experiments` file defines them too
    /// (default: the file's definitions win at every start).
    #[arg(long)]
    pub keep_stored_experiments: bool,
    /// Where experiments, exposures and events are stored when --store is not given (SQLite
    /// file `abserve.db` in this directory).
    #[arg(long, default_value = "abserve-data")]
    pub data_dir: std::path::PathBuf,
    /// The experiment store: `postgres://USER@HOST:PORT/DB` (shared by replicas), `sqlite://FILE`
    /// or a directory [default: --data-dir].
    #[arg(long, env = "ABSERVE_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// Seconds between reloads of the experiments from the store, the bound on how long a change
    /// made through another replica takes to route here (PostgreSQL's NOTIFY is usually faster).
    #[arg(long, default_value_t = 2.0)]
    pub store_poll: f64,
    /// Seconds between checks of every running experiment's guardrails (a treatment
    /// significantly worse on one is stopped; docs/dashboard.md).
    #[arg(long, default_value_t = 10.0)]
    pub guardrail_interval: f64,
    /// Test-only: admit without checking free KV cells, in one unified KV pool (the only layout
    /// that can run out: a split stream always holds its own sequence).
    #[arg(long, hide = true)]
    pub unsafe_no_admission_control: bool,
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let mut models = a.model.model_configs()?;
    for m in &mut models {
        m.config.admission_control = !a.unsafe_no_admission_control;
        // the queue bound is resolved against the plan's slots when the engine starts
        m.config.max_queue = a
            .max_queue
            .map_or(QueueLimit::PerSlot(2), QueueLimit::Fixed);
    }
    if let Some(id) = &a.model_id {
        models[0].id = id.clone();
    }
    for (name, v) in [
        ("--queue-timeout", a.queue_timeout),
        ("--drain-timeout", a.drain_timeout),
        ("--header-read-timeout", a.header_read_timeout),
        ("--store-poll", a.store_poll),
        ("--guardrail-interval", a.guardrail_interval),
    ] {
        if !(v.is_finite() && v > 0.0) {
            anyhow::bail!("{name} must be a positive number of seconds, got {v}");
        }
    }
    // a bad keys or experiments file or an unreachable store is an error before any model work
    let keys = Arc::new(Keys::new(a.api_key.clone(), a.keys.clone()).map_err(anyhow::Error::msg)?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let store = crate::args::store_location(a.store.as_deref(), &a.data_dir)?;
    let poll = Duration::from_secs_f64(a.store_poll);
    let ab = rt.block_on(AbState::open(
        &store,
        a.experiments.as_deref(),
        a.keep_stored_experiments,
        poll,
    ))?;
    let (registry, metrics) = abserve_server::start_models(models)?;
    let registry = rt.block_on(a.upstreams.extend(registry, a.max_queue))?;
    ab.check(&registry)?;
    let context = registry.default_entry().capacity().context;
    let config = ServerConfig {
        queue_timeout: Duration::from_secs_f64(a.queue_timeout),
        keys,
        body_limit: a.body_limit,
        max_prompt_tokens: a.max_prompt_tokens.unwrap_or(context - 1).min(context - 1),
        ready_cache: Duration::from_secs(2),
        drain_timeout: Duration::from_secs_f64(a.drain_timeout),
        header_read_timeout: Duration::from_secs_f64(a.header_read_timeout),
        cors_origins: a.cors_origins.clone(),
        guardrail_interval: Duration::from_secs_f64(a.guardrail_interval),
    };
    let state = AppState::new(registry, metrics, config, Some(ab));
    let addr = SocketAddr::new(a.host, a.port);
    rt.block_on(abserve_server::serve(
        state.clone(),
        addr,
        std::future::pending(),
        |bound| {
            tracing::info!(
                "listening on http://{bound} (model id '{}')",
                state.models.default_entry().id
            );
            // a line tests and scripts can wait for
            println!("abserve: listening on http://{bound}");
        },
    ))?;
    // connections cut at the drain timeout may hold blocking work (a store write): give it a
    // moment, never wait for it
    rt.shutdown_timeout(Duration::from_secs(2));
    tracing::info!("stopped");
    Ok(())
}
