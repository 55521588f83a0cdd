//! `abserve worker`: answers queued eval jobs (`abserve eval --amqp`) on one shared model in this
//! process, taking as many jobs at once as the memory plan has sequence slots. SIGTERM or
//! Ctrl-C: no new jobs; the ones in hand are finished and acknowledged, then it exits.
//!
//! `--listen ADDR` serves the server's operations routes for this process: `/health`, `/ready`
//! (the same 1-token probe and memory checks as `abserve serve`; 503 from SIGTERM on) and
//! `/metrics` (the engine's series, plus the jobs: `abserve_worker_jobs_total` by outcome,
//! `abserve_worker_jobs_in_hand`, `abserve_worker_job_seconds_total`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use abserve_protocol::names;
use abserve_queue::worker::{self, Tally};
use abserve_server::{AppState, Metrics, ServerConfig};
use clap::Args;
use prometheus::{Counter, IntCounterVec, IntGauge, Opts};

use crate::args::ModelArgs;
use crate::upstreams::UpstreamArgs;

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// RabbitMQ to take jobs from, e.g. amqp://guest:guest@127.0.0.1:5672/%2f
    #[arg(long, env = "ABSERVE_AMQP", hide_env_values = true)]
    pub amqp: String,
    /// The jobs queue (its dead-letter queue is QUEUE.dead).
    #[arg(long, default_value = "abserve.jobs")]
    pub queue: String,
    /// Failures of one job (errors, not crashes) before it goes to the dead-letter queue.
    #[arg(long, default_value_t = 3)]
    pub max_failures: u32,
    /// Also commit each result (once per job id) to this store's eval-jobs ledger (table
    /// `eval_results`) before acknowledging: postgres://…, sqlite://FILE or a directory.
    #[arg(long, env = "ABSERVE_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// Serve /health, /ready and /metrics on this address, e.g. 0.0.0.0:9091 (port 0: any free
    /// port; the address is printed). Default: no HTTP at all.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub upstreams: UpstreamArgs,
}

pub fn run(a: WorkerArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let ledger = match &a.store {
        Some(s) => Some(rt.block_on(abserve_queue::ledger::Ledger::connect(&s.parse()?))?),
        None => None,
    };
    // bound before the model loads: a taken port is an error before any model work
    let listener = match a.listen {
        Some(addr) => Some(rt.block_on(tokio::net::TcpListener::bind(addr))?),
        None => None,
    };
    let (registry, metrics) = abserve_server::start_models(a.model.model_configs()?)?;
    let registry = rt.block_on(a.upstreams.extend(registry, None))?;
    for m in registry.iter() {
        if let Some(plan) = m.plan() {
            eprintln!(
                "worker: model '{}' loaded; {} sequence slots, planned {} bytes on the host (budget {} bytes)",
                m.id, plan.seq_slots, plan.host_planned_bytes, plan.budget_bytes
            );
        }
    }
    let slots = registry.seq_slots() as u64;
    let tally = Arc::new(Tally::default());
    let ops = match listener {
        Some(listener) => {
            export_tally(&metrics, tally.clone())?;
            let config = ServerConfig::operations();
            let state = AppState::new(registry.clone(), metrics, config, None);
            eprintln!(
                "worker: /health, /ready and /metrics on http://{}",
                listener.local_addr()?
            );
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let task = rt.spawn(abserve_server::serve_ops(state.clone(), listener, async {
                let _ = rx.await;
            }));
            Some((state, tx, task))
        }
        None => None,
    };
    let opts = worker::Options {
        amqp: a.amqp.clone(),
        queue: a.queue.clone(),
        max_failures: a.max_failures,
        ledger,
    };
    let draining = ops.as_ref().map(|(state, _, _)| state.clone());
    let stop = async move {
        stop_signal().await;
        // /ready says 503 while the jobs in hand finish; /metrics keeps answering
        if let Some(state) = draining {
            state.shutting_down.store(true, Ordering::SeqCst);
        }
    };
    let worked = rt.block_on(worker::work(
        Arc::new(registry),
        slots.min(u16::MAX as u64) as u16,
        opts,
        tally.clone(),
        stop,
    ));
    if let Some((_, tx, task)) = ops {
        let _ = tx.send(());
        let _ = rt.block_on(task);
    }
    worked?;
    let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
    eprintln!(
        "worker: stopped; {} answered, {} retried, {} dead-lettered",
        n(&tally.answered),
        n(&tally.retried),
        n(&tally.dead_lettered)
    );
    Ok(())
}

/// The worker's job counts as series of the process's registry, copied from the tally at every
/// scrape (the hooks run one at a time, so two scrapes never add the same jobs twice).
fn export_tally(metrics: &Metrics, tally: Arc<Tally>) -> prometheus::Result<()> {
    let jobs = IntCounterVec::new(
        Opts::new(
            names::WORKER_JOBS,
            "Jobs this worker finished, by outcome (answered, retried, dead_lettered, returned)",
        ),
        &["outcome"],
    )?;
    let in_hand = IntGauge::new(
        names::WORKER_JOBS_IN_HAND,
        "Jobs delivered to this worker and not yet acknowledged",
    )?;
    let seconds = Counter::new(
        names::WORKER_JOB_SECONDS,
        "Seconds from delivery to acknowledgement, summed over finished jobs",
    )?;
    metrics.register(jobs.clone())?;
    metrics.register(in_hand.clone())?;
    metrics.register(seconds.clone())?;
    let outcomes = |t: &Tally| {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("answered", n(&t.answered)),
            ("retried", n(&t.retried)),
            ("dead_lettered", n(&t.dead_lettered)),
            ("returned", n(&t.returned)),
        ]
    };
    // every outcome from 0, so that rates exist at once
    for (outcome, _) in outcomes(&tally) {
        jobs.with_label_values(&[outcome]);
    }
    metrics.on_render(move || {
        for (outcome, now) in outcomes(&tally) {
            let c = jobs.with_label_values(&[outcome]);
            c.inc_by(now.saturating_sub(c.get()));
        }
        in_hand.set(tally.in_hand.load(Ordering::Relaxed) as i64);
        let busy = tally.busy_micros.load(Ordering::Relaxed) as f64 / 1e6;
        seconds.inc_by((busy - seconds.get()).max(0.0));
    });
    Ok(())
}

async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
