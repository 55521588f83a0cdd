//! Runs an evaluation: every row on every variant, as many at once as the target can hold,
//! retrying 429s after the server's Retry-After (plus jitter) and recording other failures on
//! their row; then the judge's pairs. Everything finished is appended to the run's files at
//! once, and a rerun skips it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abserve_ab::{template_fields, Variant, VariantError};
use abserve_engine::ChatMessage;
use futures::StreamExt;
use rand::Rng;
use serde_json::Value;

use crate::config::{EvalConfig, ScorerKind};
use crate::dataset::{Dataset, Row};
use crate::error::EvalError;
use crate::judge;
use crate::progress::Progress;
use crate::results::{latest, latest_judgments, Judgment, Log, ResultRow};
use crate::scorers;
use crate::target::{Call, CallError, Capacity, Target};

/// Answers longer than this are cut when a variant sets no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 256;

/// Checks every template against the dataset (before any model work): a variable no row has
/// is an error; rows lacking one are reported and left out.
pub fn check(cfg: &EvalConfig, ds: &mut Dataset) -> Result<(), EvalError> {
    let none: HashSet<&str> = HashSet::new();
    for v in &cfg.experiment.variants {
        let f = template_fields(&v.template).map_err(|e| EvalError::Config(format!("variant '{}': {e}", v.id)))?;
        ds.require(&format!("the template of variant '{}'", v.id), &f, &none)?;
    }
    for s in &cfg.scorers {
        for t in s.templates() {
            let f = template_fields(t).map_err(|e| EvalError::Config(format!("scorer '{}': {e}", s.name)))?;
            ds.require(&format!("scorer '{}'", s.name), &f, &none)?;
        }
        if let ScorerKind::Judge { prompt, .. } = &s.kind {
            let f = template_fields(prompt).map_err(|e| EvalError::Config(format!("scorer '{}': {e}", s.name)))?;
            ds.require(&format!("the prompt of scorer '{}'", s.name), &f, &["a", "b"].into())?;
        }
    }
    if ds.rows.is_empty() {
        return Err(EvalError::Dataset("no dataset row is usable".into()));
    }
    Ok(())
}


/// The chat request of `v` for `row`. Without a variant seed, all variants of a row share one
/// (derived from the row's id): sampled variants then differ by their prompts, not by luck.
pub fn call_for(v: &Variant, row: &Row) -> Result<Call, VariantError> {
    let messages = v.chat_for_row(&Value::Object(row.fields.clone()))?;
    let s = v.sampling();
    Ok(Call {
        messages: messages.iter().map(|m| ChatMessage::new(&m.role, &m.content)).collect(),
        temperature: s.temperature,
        top_p: s.top_p,
        max_tokens: s.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        seed: Some(s.seed.unwrap_or_else(|| crate::dataset::fnv1a(row.id.bytes()) >> 1)),
        stop: s.stop,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
    })
}

#[derive(Debug, Clone)]
pub struct Options {
    pub out: PathBuf,
    /// Requests in flight when the target does not say (`-j`).
    pub fallback_concurrency: usize,
    /// Overrides the capacity the target reports.
    pub concurrency: Option<usize>,
    /// Give up on a row after this many 429s in a row.
    pub max_overloaded: u32,
}

/// What a run produced: the latest result per (row, variant) and judgment per pair.
pub struct Outcome {
    pub results: BTreeMap<(String, String), ResultRow>,
    pub judgments: BTreeMap<(String, String), Judgment>,
    pub capacity: Capacity,
    pub generated_now: u64,
    pub skipped_done: u64,
    pub wall: Duration,
    pub peak_memory: Option<u64>,
}

/// Asks the target, retrying 429s (Retry-After, else exponential backoff; with jitter) and
/// transient failures (3 tries).
async fn ask(target: &Target, call: &Call, max_overloaded: u32) -> (Result<crate::target::Generation, CallError>, u32) {
    let (mut attempts, mut overloaded, mut transient) = (0u32, 0u32, 0u32);
    loop {
        attempts += 1;
        let wait = match target.chat(call).await {
            Ok(g) => return (Ok(g), attempts),
            Err(e @ CallError::Failed(_)) => return (Err(e), attempts),
            Err(e @ CallError::Overloaded { retry_after }) => {
                overloaded += 1;
                if overloaded > max_overloaded {
                    return (Err(e), attempts);
                }
                retry_after.unwrap_or_else(|| Duration::from_millis(250 << overloaded.min(5)))
            }
            Err(e @ CallError::Transient(_)) => {
                transient += 1;
                if transient >= 3 {
                    return (Err(e), attempts);
                }
                Duration::from_millis(500 << transient)
            }
        };
        let jitter = rand::thread_rng().gen_range(0.0..0.5);
        tokio::time::sleep(wait.mul_f64(1.0 + jitter).max(Duration::from_millis(50))).await;
    }
}

async fn score_all(cfg: &EvalConfig, row: &Row, r: &mut ResultRow, only_missing: bool) {
    if !r.ok() {
        return;
    }
    for s in &cfg.scorers {
        if matches!(s.kind, ScorerKind::Judge { .. }) || (only_missing && (r.scores.contains_key(&s.name) || r.score_errors.contains_key(&s.name))) {
            continue;
        }
        match scorers::score(s, row, r).await {
            Ok(x) => {
                r.scores.insert(s.name.clone(), x);
            }
            Err(e) => {
                r.score_errors.insert(s.name.clone(), e.to_string());
            }
        }
    }
}

async fn generate(cfg: &EvalConfig, v: &Variant, row: &Row, target: &Target, max_overloaded: u32) -> ResultRow {
    let mut r = ResultRow {
        row: row.id.clone(),
        line: row.line,
        variant: v.id.clone(),
        input: row.input().to_string(),
        expected: row.expected(),
        output: None,
        prompt_tokens: 0,
        completion_tokens: 0,
        ttft_ms: None,
        latency_ms: None,
        finish_reason: None,
        scores: BTreeMap::new(),
        score_errors: BTreeMap::new(),
        error: None,
        attempts: 0,
    };
    let call = match call_for(v, row) {
        Ok(c) => c,
        Err(e) => {
            r.error = Some(e.to_string());
            return r;
        }
    };
    let (res, attempts) = ask(target, &call, max_overloaded).await;
    r.attempts = attempts;
    match res {
        Ok(g) => {
            r.output = Some(g.text);
            r.prompt_tokens = g.prompt_tokens;
            r.completion_tokens = g.completion_tokens;
            r.ttft_ms = Some(g.ttft.as_secs_f64() * 1e3);
            r.latency_ms = Some(g.latency.as_secs_f64() * 1e3);
            r.finish_reason = Some(g.finish_reason);
            score_all(cfg, row, &mut r, false).await;
        }
        Err(e) => r.error = Some(e.to_string()),
    }
    r
}

/// Runs what is not done yet and returns everything done, old and new.
pub async fn run(cfg: &EvalConfig, ds: &Dataset, target: Arc<Target>, judge_target: Option<Arc<Target>>, opts: &Options) -> Result<Outcome, EvalError> {
    let started = std::time::Instant::now();
    std::fs::create_dir_all(&opts.out).map_err(EvalError::io(&opts.out))?;
    let (log, old) = Log::open::<ResultRow>(&opts.out.join("results.jsonl"))?;
    let mut results = latest(old);
    let variants: BTreeSet<&str> = cfg.experiment.variants.iter().map(|v| v.id.as_str()).collect();
    let rows: BTreeMap<&str, &Row> = ds.rows.iter().map(|r| (r.id.as_str(), r)).collect();

    rescore(cfg, &rows, &mut results, &log).await?;

    let mut capacity = target.capacity(opts.fallback_concurrency).await;
    if let Some(c) = opts.concurrency {
        capacity = Capacity { concurrency: c.max(1), source: "--concurrency".into(), abserve: capacity.abserve };
    }
    let mut jobs = Vec::new();
    let mut skipped_done = 0;
    for row in &ds.rows {
        for v in &cfg.experiment.variants {
            match results.get(&(row.id.clone(), v.id.clone())) {
                Some(r) if r.ok() => skipped_done += 1,
                _ => jobs.push((row, v)),
            }
        }
    }
    let total = jobs.len() as u64;
    if skipped_done > 0 {
        eprintln!("eval: resuming: {skipped_done} answers already in {}, {total} to go", opts.out.display());
    }
    let done = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let progress = Arc::new(Progress::new("generate", total));
    let ticker = spawn_ticker(progress.clone(), target.clone(), capacity.abserve, done.clone(), tokens.clone(), peak.clone());
    let mut errors: Vec<String> = Vec::new();
    let mut stream = futures::stream::iter(jobs)
        .map(|(row, v)| {
            let target = target.clone();
            async move { generate(cfg, v, row, &target, opts.max_overloaded).await }
        })
        .buffer_unordered(capacity.concurrency);
    while let Some(r) = stream.next().await {
        log.append(&r)?;
        tokens.fetch_add(r.completion_tokens, Ordering::Relaxed);
        done.fetch_add(1, Ordering::Relaxed);
        if let Some(e) = &r.error {
            errors.push(format!("row {} (line {}) × {}: {e}", r.row, r.line, r.variant));
        }
        results.insert((r.row.clone(), r.variant.clone()), r);
    }
    drop(stream);
    ticker.abort();
    progress.update(done.load(Ordering::Relaxed), tokens.load(Ordering::Relaxed), None);
    progress.finish();
    print_errors(&errors);
    let generated_now = total;
    results.retain(|(row, v), _| rows.contains_key(row.as_str()) && variants.contains(v.as_str()));

    let judgments = match cfg.judge() {
        Some(s) => {
            let ScorerKind::Judge { prompt, seed, .. } = &s.kind else { unreachable!() };
            let jt = judge_target.unwrap_or_else(|| target.clone());
            judge_pairs(cfg, ds, &results, jt, prompt, *seed, capacity.concurrency, opts).await?
        }
        None => BTreeMap::new(),
    };
    let peak = peak.load(Ordering::Relaxed);
    Ok(Outcome {
        results,
        judgments,
        capacity,
        generated_now,
        skipped_done,
        wall: started.elapsed(),
        peak_memory: (peak > 0).then_some(peak),
    })
}

/// Finished answers that lack a scorer added since the run that made them are scored now,
/// without generating again.
async fn rescore(cfg: &EvalConfig, rows: &BTreeMap<&str, &Row>, results: &mut BTreeMap<(String, String), ResultRow>, log: &Log) -> Result<(), EvalError> {
    for ((row_id, _), r) in results.iter_mut() {
        let Some(row) = rows.get(row_id.as_str()) else { continue };
        let before = (r.scores.len(), r.score_errors.len());
        score_all(cfg, row, r, true).await;
        if before != (r.scores.len(), r.score_errors.len()) {
            log.append(r)?;
        }
    }
    Ok(())
}

/// The first ten errors of a run, and how many more there were.
fn print_errors(errors: &[String]) {
    for e in errors.iter().take(10) {
        eprintln!("eval: error: {e}");
    }
    if errors.len() > 10 {
        eprintln!("eval: … and {} more errors (see results.jsonl)", errors.len() - 10);
    }
}

fn spawn_ticker(p: Arc<Progress>, t: Arc<Target>, memory: bool, done: Arc<AtomicU64>, tokens: Arc<AtomicU64>, peak: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let m = if memory { t.memory().await } else { None };
            if let Some(m) = m {
                peak.fetch_max(m, Ordering::Relaxed);
            }
            p.update(done.load(Ordering::Relaxed), tokens.load(Ordering::Relaxed), m);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

#[allow(clippy::too_many_arguments)]
async fn judge_pairs(
    cfg: &EvalConfig,
    ds: &Dataset,
    results: &BTreeMap<(String, String), ResultRow>,
    target: Arc<Target>,
    prompt: &str,
    seed: u64,
    concurrency: usize,
    opts: &Options,
) -> Result<BTreeMap<(String, String), Judgment>, EvalError> {
    let (log, old) = Log::open::<Judgment>(&opts.out.join("judgments.jsonl"))?;
    let mut judged = latest_judgments(old);
    let control = cfg.control().to_string();
    let mut pairs = Vec::new();
    for row in &ds.rows {
        let Some(c) = results.get(&(row.id.clone(), control.clone())).filter(|r| r.ok()) else { continue };
        for v in cfg.experiment.variants.iter().filter(|v| v.id != control) {
            let Some(t) = results.get(&(row.id.clone(), v.id.clone())).filter(|r| r.ok()) else { continue };
            if judged.get(&(row.id.clone(), v.id.clone())).is_some_and(|j| j.verdict.is_some()) {
                continue;
            }
            pairs.push((row, v.id.clone(), c.output.clone().unwrap_or_default(), t.output.clone().unwrap_or_default()));
        }
    }
    let progress = Progress::new("judge", pairs.len() as u64);
    let mut n = 0;
    let mut stream = futures::stream::iter(pairs)
        .map(|(row, variant, control_out, variant_out)| {
            let target = target.clone();
            let control = control.clone();
            async move {
                let first = judge::variant_first(seed, &row.id, &variant);
                let (a, b) = if first { (&variant_out, &control_out) } else { (&control_out, &variant_out) };
                let mut j = Judgment {
                    row: row.id.clone(),
                    variant,
                    control,
                    variant_position: if first { "A" } else { "B" }.into(),
                    reply: None,
                    verdict: None,
                    error: None,
                };
                match judge::question(prompt, row, a, b) {
                    Ok(call) => match ask(&target, &call, opts.max_overloaded).await.0 {
                        Ok(g) => {
                            j.verdict = Some(judge::verdict(&g.text, first));
                            j.reply = Some(g.text);
                        }
                        Err(e) => j.error = Some(e.to_string()),
                    },
                    Err(e) => j.error = Some(e.to_string()),
                }
                j
            }
        })
        .buffer_unordered(concurrency);
    while let Some(j) = stream.next().await {
        log.append(&j)?;
        n += 1;
        progress.update(n, 0, None);
        judged.insert((j.row.clone(), j.variant.clone()), j);
    }
    progress.finish();
    judged.retain(|(row, v), _| results.contains_key(&(row.clone(), v.clone())));
    Ok(judged)
}

