//! `abserve worker`: answers queued eval jobs (`abserve eval --amqp`) on one shared model in this
//! process, taking as many jobs at once as the memory plan has sequence slots. SIGTERM or
//! Ctrl-C: no new jobs; the ones in hand are finished and acknowledged, then it exits.

use std::sync::Arc;

use abserve_engine::Engine;
use abserve_eval::worker::{self, Tally};
use abserve_eval::Target;
use clap::Args;

use crate::args::ModelArgs;

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
    /// Also commit each result (once per job id) to this store before acknowledging:
    /// postgres://…, sqlite://FILE or a directory.
    #[arg(long, env = "ABSERVE_STORE", hide_env_values = true)]
    pub store: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(a: WorkerArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let store = match &a.store {
        Some(s) => Some(rt.block_on(abserve_ab::Store::connect(&s.parse()?))?),
        None => None,
    };
    let engine = Engine::start(a.model.engine_config()?)?;
    let plan = engine.plan().clone();
    eprintln!(
        "worker: model loaded; {} sequence slots, planned {} bytes on the host (budget {} bytes)",
        plan.seq_slots, plan.host_planned_bytes, plan.budget_bytes
    );
    let target = Arc::new(Target::Engine(Arc::new(engine)));
    let tally = Arc::new(Tally::default());
    let opts = worker::Options {
        amqp: a.amqp.clone(),
        queue: a.queue.clone(),
        max_failures: a.max_failures,
        store,
    };
    rt.block_on(worker::work(
        target,
        plan.seq_slots.min(u16::MAX as u64) as u16,
        opts,
        tally.clone(),
        stop_signal(),
    ))?;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "worker: stopped; {} answered, {} retried, {} dead-lettered",
        n(&tally.answered),
        n(&tally.retried),
        n(&tally.dead_lettered)
    );
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
