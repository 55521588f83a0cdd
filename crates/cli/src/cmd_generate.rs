//! `abserve generate`: runs every prompt at once on one in-process engine (a registry of one
//! model, prepared and submitted as `serve` does) and prints each
//! output with its token counts and timings, plus the memory plan and the measured peak RSS.

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use abserve_engine::plan::{human_bytes, peak_rss};
use abserve_engine::prepare::{Input, Options};
use abserve_engine::{ChatMessage, Engine};
use abserve_models::{Entry, Prepared, Registry};
use abserve_protocol::{Sampling, Structure};
use anyhow::Context;
use clap::Args;
use serde::Deserialize;

use crate::args::ModelArgs;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A prompt (repeat the flag for several; they run concurrently).
    #[arg(long = "prompt")]
    pub prompts: Vec<String>,
    /// JSONL file: one object per line with `prompt` (or `messages`) and sampling params.
    #[arg(long = "prompts")]
    pub prompts_file: Option<PathBuf>,
    /// Wrap each --prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Keep generating past end-of-generation tokens (benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// With --json: the log-probability of each token and this many alternatives.
    #[arg(long)]
    pub logprobs: Option<u32>,
    /// One JSON object per output instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One line of `--prompts`: a prompt or messages, the one [`Sampling`] (flattened), and the
/// options that are not sampling settings.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptLine {
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    logprobs: Option<u32>,
    ignore_eos: Option<bool>,
    #[serde(flatten)]
    sampling: Sampling,
    /// response_format (and tools) of this line.
    #[serde(flatten)]
    structure: Structure,
}

/// The command line's settings, under each prompt line's own.
fn base_sampling(a: &GenerateArgs) -> Sampling {
    Sampling {
        temperature: Some(f64::from(a.temperature)),
        max_tokens: Some(i64::from(a.max_tokens)),
        seed: a.seed.map(|s| s as i64),
        ..Default::default()
    }
}

fn options(a: &GenerateArgs, logprobs: Option<u32>, ignore_eos: Option<bool>) -> Options {
    Options {
        logprobs: logprobs.or(a.logprobs),
        ignore_eos: ignore_eos.unwrap_or(a.ignore_eos),
        ..Options::new(a.max_tokens)
    }
}

/// Every prompt, prepared by the registry's model as the server prepares a request.
fn load_prompts(a: &GenerateArgs, model: &Entry) -> anyhow::Result<Vec<Prepared>> {
    let base = base_sampling(a);
    let mut jobs = Vec::new();
    for (i, p) in a.prompts.iter().enumerate() {
        let messages = [ChatMessage::new("user", p)];
        let input = if a.chat {
            Input::Chat(&messages)
        } else {
            Input::Text(p)
        };
        let job = model
            .prepare(
                input,
                &base,
                &Structure::default(),
                &options(a, None, None),
                usize::MAX,
            )
            .map_err(|e| anyhow::anyhow!("--prompt {}: {}: {e}", i + 1, e.field))?;
        jobs.push(job);
    }
    if let Some(f) = &a.prompts_file {
        let file =
            std::fs::File::open(f).with_context(|| format!("cannot open {}", f.display()))?;
        for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
            let at = || format!("{} line {}", f.display(), i + 1);
            let line = line.with_context(|| format!("{}: cannot read", at()))?;
            if line.trim().is_empty() {
                continue;
            }
            let pl: PromptLine = serde_json::from_str(&line).with_context(at)?;
            let sampling = base.overlaid(&pl.sampling);
            let input = match (&pl.prompt, &pl.messages) {
                (Some(p), None) => Input::Text(p),
                (None, Some(m)) => Input::Chat(m),
                _ => anyhow::bail!("{}: give exactly one of prompt or messages", at()),
            };
            let job = model
                .prepare(
                    input,
                    &sampling,
                    &pl.structure,
                    &options(a, pl.logprobs, pl.ignore_eos),
                    usize::MAX,
                )
                .map_err(|e| anyhow::anyhow!("{}: {}: {e}", at(), e.field))?;
            jobs.push(job);
        }
    }
    if jobs.is_empty() {
        anyhow::bail!("no prompts: pass --prompt TEXT or --prompts FILE");
    }
    Ok(jobs)
}

/// One finished generation, as a JSON line or a header line and the text.
fn print_output(
    i: usize,
    prompt: &[i32],
    o: &abserve_engine::Output,
    json: bool,
) -> anyhow::Result<()> {
    let c = &o.completion;
    let gen_time = c
        .total_time
        .saturating_sub(c.time_to_first_token)
        .as_secs_f64();
    let tps = if c.completion_tokens > 1 && gen_time > 0.0 {
        (c.completion_tokens - 1) as f64 / gen_time
    } else {
        0.0
    };
    if json {
        let logprobs = if o.logprobs.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::to_value(&o.logprobs)?
        };
        println!(
            "{}",
            serde_json::json!({
                "index": i, "text": o.text, "tokens": o.tokens, "prompt_token_ids": prompt,
                "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                "finish_reason": c.finish_reason, "ttft_ms": c.time_to_first_token.as_secs_f64() * 1e3,
                "total_ms": c.total_time.as_secs_f64() * 1e3, "tokens_per_second": tps,
                "preemptions": c.preemptions, "shared_prompt_tokens": c.shared_prompt_tokens,
                "logprobs": logprobs,
            })
        );
    } else {
        println!(
            "--- [{}] prompt {} tok, output {} tok, ttft {:.0} ms, {:.1} tok/s, finish {}{}",
            i + 1,
            c.prompt_tokens,
            c.completion_tokens,
            c.time_to_first_token.as_secs_f64() * 1e3,
            tps,
            c.finish_reason.as_str(),
            if c.preemptions > 0 {
                format!(", preempted {}×", c.preemptions)
            } else {
                String::new()
            },
        );
        println!("{}", o.text);
    }
    Ok(())
}

pub fn run(a: GenerateArgs) -> anyhow::Result<()> {
    let cfg = a.model.engine_config()?;
    let engine = Arc::new(Engine::start(cfg)?);
    let registry = Registry::local(vec![("default".to_string(), engine.clone())])
        .map_err(anyhow::Error::msg)?;
    let model = registry.default_entry();
    let jobs = load_prompts(&a, model)?;
    // validate everything before any work starts
    let mut receivers = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let rx = model
            .submit(vec![j.clone()], abserve_engine::Placement::default())
            .map_err(|e| anyhow::anyhow!("prompt {}: {e}", i + 1))?
            .remove(0);
        receivers.push(rx);
    }
    let started = Instant::now();
    let handles: Vec<_> = receivers
        .into_iter()
        .map(|rx| std::thread::spawn(move || abserve_engine::collect_blocking(rx)))
        .collect();
    let mut failed = 0;
    let mut total_tokens = 0usize;
    for (i, h) in handles.into_iter().enumerate() {
        match h.join().expect("collector thread") {
            Ok(o) => {
                total_tokens += o.completion.completion_tokens;
                print_output(i, &jobs[i].prompt, &o, a.json)?;
            }
            Err(e) => {
                failed += 1;
                eprintln!("--- [{}] error: {e}", i + 1);
            }
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let plan = engine.plan();
    let stats = engine.stats();
    let summary = format!(
        "{} prompts, {} output tokens in {:.2} s ({:.1} tok/s aggregate); peak RSS {} vs planned {} (budget {}); KV peak {} of {} cells; preemptions {}",
        jobs.len(),
        total_tokens,
        wall,
        total_tokens as f64 / wall.max(1e-9),
        human_bytes(peak_rss()),
        human_bytes(plan.planned_bytes),
        human_bytes(plan.budget_bytes),
        stats.kv_cells_peak,
        stats.kv_cells_total,
        stats.preemptions,
    );
    if a.json {
        println!(
            "{}",
            serde_json::json!({"summary": {
                "plan": plan, "measured": engine.measured(), "peak_rss_bytes": peak_rss(),
                "wall_seconds": wall, "stats": stats,
            }})
        );
    } else {
        for l in plan.summary_lines() {
            println!("{l}");
        }
        println!("{summary}");
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} prompts failed", jobs.len());
    }
    Ok(())
}
