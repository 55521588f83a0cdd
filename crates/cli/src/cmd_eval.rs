//! `abserve eval`: every variant of an experiment over every row of a dataset, on the engine
//! in this process (`--model`) or any OpenAI-compatible endpoint (`--url`), with scorers,
//! paired statistics and a report. Everything is checked before any model work starts.

use std::path::PathBuf;
use std::sync::Arc;

use abserve_eval::{
    summarize_run, table, Dataset, EvalConfig, Http, Options, QueueSpec, RunFacts, ScorerKind,
    Source, Target,
};
use anyhow::Context;
use clap::Args;

use crate::args::ModelArgs;

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Experiment file: one [[experiment]] with its variants, plus [[scorer]] tables.
    pub experiment: PathBuf,
    /// Inputs: JSONL (one object per line) or CSV with a header; needs an `input` field.
    #[arg(long)]
    pub dataset: PathBuf,
    /// Where results.jsonl, judgments.jsonl, summary.json and the reports go. A rerun with the
    /// same folder resumes: answers already there are not asked again.
    #[arg(long, default_value = "eval-out")]
    pub out: PathBuf,
    /// An OpenAI-compatible endpoint instead of the in-process engine
    /// (abserve, vLLM, llama.cpp server, https://api.openai.com).
    #[arg(long, conflicts_with = "model")]
    pub url: Option<String>,
    /// Publish the rows × variants as jobs on RabbitMQ for `abserve worker`s to answer
    /// (e.g. amqp://guest:guest@127.0.0.1:5672/%2f) instead of asking a model here.
    #[arg(long, env = "ABSERVE_AMQP", hide_env_values = true, conflicts_with_all = ["url", "model"])]
    pub amqp: Option<String>,
    /// The jobs queue the workers consume (with --amqp).
    #[arg(long, default_value = "abserve.jobs", requires = "amqp")]
    pub queue: String,
    /// Model name at --url (default: the first of its /v1/models).
    #[arg(long, requires = "url")]
    pub remote_model: Option<String>,
    /// Sent as every request's `service_tier` at --url: with abserve, `batch` (or OpenAI's
    /// `flex`) runs the eval behind live traffic on the same model (priority classes).
    #[arg(long, requires = "url")]
    pub service_tier: Option<String>,
    /// Environment variable that holds the API key for --url.
    #[arg(long, default_value = "OPENAI_API_KEY")]
    pub api_key_env: String,
    /// Requests in flight for an endpoint that does not report its capacity (not abserve).
    #[arg(short = 'j', long = "jobs", default_value_t = 4)]
    pub jobs: usize,
    /// Requests in flight, overriding the capacity from the memory plan or /ready.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Give a row up after this many 429 answers in a row.
    #[arg(long, default_value_t = 30)]
    pub max_retries: u32,
    #[command(flatten)]
    pub model: ModelArgs,
    /// In process: models served elsewhere that variants may name (`--upstream ID=URL`).
    #[command(flatten)]
    pub upstreams: crate::upstreams::UpstreamArgs,
}

pub fn run(a: EvalArgs) -> anyhow::Result<()> {
    // all checks before any model work
    let cfg = EvalConfig::load(&a.experiment)?;
    let mut ds = Dataset::load(&a.dataset)?;
    abserve_eval::check(&cfg, &mut ds)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.dataset.display()))?;
    for b in &ds.bad {
        eprintln!(
            "eval: {} line {}: {} (left out)",
            a.dataset.display(),
            b.line,
            b.reason
        );
    }
    if a.jobs == 0 || a.concurrency == Some(0) {
        anyhow::bail!("-j and --concurrency must be at least 1");
    }
    if a.url.is_none() && a.amqp.is_none() {
        models_named(&a, &cfg)?;
    }
    let key = std::env::var(&a.api_key_env).ok().filter(|k| !k.is_empty());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let source = source(&a, key.clone()).await?;
        let described = match &source {
            Source::Target(t) => t.describe(),
            Source::Queue(q) => format!(
                "workers of queue '{}' at {}",
                q.queue,
                abserve_queue::topology::without_password(&q.amqp)
            ),
        };
        let in_process = matches!(&source, Source::Target(t) if matches!(**t, Target::Engine(_)));
        let judge_target = match cfg.judge().map(|s| &s.kind) {
            Some(ScorerKind::Judge {
                url: Some(u),
                model,
                ..
            }) => Some(Arc::new(Target::Http(
                Http::connect(u, key.clone(), model.clone()).await?,
            ))),
            _ => None,
        };
        let opts = Options {
            out: a.out.clone(),
            fallback_concurrency: a.jobs,
            concurrency: a.concurrency,
            max_overloaded: a.max_retries,
        };
        eprintln!(
            "eval: {} rows × {} variants ({}) on {}",
            ds.rows.len(),
            cfg.experiment.variants.len(),
            cfg.experiment
                .variants
                .iter()
                .map(|v| v.id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            described
        );
        let outcome = abserve_eval::run(&cfg, &ds, source, judge_target, &opts).await?;
        let facts = RunFacts {
            target: described,
            concurrency: outcome.capacity.concurrency,
            concurrency_source: outcome.capacity.source.clone(),
            wall_seconds: outcome.wall.as_secs_f64(),
            peak_memory_bytes: if in_process {
                Some(abserve_engine::plan::peak_rss())
            } else {
                outcome.peak_memory
            },
        };
        let s = summarize_run(&cfg, &ds, &outcome.results, &outcome.judgments, facts);
        report(&a.out, &s, &ds, &outcome)
    })
}

/// Writes summary.json, report.md and report.html into `out`, prints the table and the totals;
/// an error when every answer failed.
fn report(
    out: &std::path::Path,
    s: &abserve_eval::Summary,
    ds: &Dataset,
    outcome: &abserve_eval::Outcome,
) -> anyhow::Result<()> {
    std::fs::write(out.join("summary.json"), serde_json::to_string_pretty(s)?)
        .context("writing summary.json")?;
    std::fs::write(out.join("report.md"), abserve_eval::report_md(s))
        .context("writing report.md")?;
    let html = abserve_eval::report_html(s, ds, &outcome.results, &outcome.judgments)?;
    std::fs::write(out.join("report.html"), html).context("writing report.html")?;
    println!("{}", table(s));
    if let Some(w) = abserve_eval::judge_warning(s) {
        println!("judge: {w}");
    }
    let answered: usize = s.variants.iter().map(|v| v.answered).sum();
    let failed: usize = s.variants.iter().map(|v| v.errors).sum();
    println!(
        "{answered} answers ({} asked now, {} from an earlier run), {failed} failed; {} tokens; this run took {:.1} s at {} concurrent ({})",
        outcome.generated_now,
        outcome.skipped_done,
        s.generated_tokens,
        s.wall_seconds,
        s.concurrency,
        s.concurrency_source
    );
    println!(
        "report: {}  (also summary.json, report.md, results.jsonl)",
        out.join("report.html").display()
    );
    if answered == 0 {
        anyhow::bail!(
            "every answer failed; first error: {}",
            s.errors.first().map(String::as_str).unwrap_or("unknown")
        );
    }
    Ok(())
}

/// In process: every model a variant names must be one of the `--model` flags (checked before
/// any model loads).
fn models_named(a: &EvalArgs, cfg: &EvalConfig) -> anyhow::Result<()> {
    let mut ids: Vec<String> = a
        .model
        .models_sharing(|_| Ok(()))?
        .into_iter()
        .map(|m| m.id)
        .collect();
    ids.extend(a.upstreams.configs()?.into_iter().map(|c| c.id));
    for v in &cfg.experiment.variants {
        if let Some(m) = v.model.as_ref().filter(|m| !ids.contains(m)) {
            anyhow::bail!(
                "variant '{}' names the model '{m}', and this eval runs {} in process (add --model {m}=FILE or --upstream {m}=URL)",
                v.id,
                ids.join(", ")
            );
        }
    }
    Ok(())
}

/// Where the answers come from: a URL, workers of a queue, or an engine in this process.
async fn source(a: &EvalArgs, key: Option<String>) -> anyhow::Result<Source> {
    Ok(match (&a.url, &a.amqp) {
        (Some(url), _) => Source::Target(Arc::new(Target::Http(
            Http::connect(url, key, a.remote_model.clone())
                .await?
                .at_tier(a.service_tier.clone()),
        ))),
        (None, Some(amqp)) => Source::Queue(QueueSpec {
            amqp: amqp.clone(),
            queue: a.queue.clone(),
            prefetch: 64,
        }),
        (None, None) => {
            let models = a.model.model_configs()?;
            let engines =
                tokio::task::spawn_blocking(move || abserve_engine::models::start_all(models))
                    .await??;
            let registry = abserve_models::Registry::local(engines).map_err(anyhow::Error::msg)?;
            let registry = a.upstreams.extend(registry, None).await?;
            Source::Target(Arc::new(Target::Engine(Arc::new(registry))))
        }
    })
}
