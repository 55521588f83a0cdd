//! Runs an evaluation: every row on every variant, as many at once as the target can hold,
//! retrying 429s after the server's Retry-After (plus jitter) and recording other failures on
//! their row; then the judge's pairs. Everything finished is appended to the run's files at
//! once, and a rerun skips it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abserve_ab::{template_fields, Variant};
use futures::StreamExt;
use rand::Rng;

use crate::config::{EvalConfig, ScorerKind};
use crate::dataset::{Dataset, Row};
use crate::error::EvalError;
use crate::judge;
use crate::progress::Progress;
use crate::results::{latest, latest_judgments, Judgment, Log, ResultRow};
use crate::row_call::{blank, call_for, record, score_all};
use crate::target::{Call, CallError, Capacity, Target};

/// Checks every template against the dataset (before any model work): a variable no row has
/// is an error; rows lacking one are reported and left out.
pub fn check(cfg: &EvalConfig, ds: &mut Dataset) -> Result<(), EvalError> {
    let none: HashSet<&str> = HashSet::new();
    for v in &cfg.experiment.variants {
        let f = template_fields(&v.template)
            .map_err(|e| EvalError::Config(format!("variant '{}': {e}", v.id)))?;
        ds.require(&format!("the template of variant '{}'", v.id), &f, &none)?;
    }
    for s in &cfg.scorers {
        for t in s.templates() {
            let f = template_fields(t)
                .map_err(|e| EvalError::Config(format!("scorer '{}': {e}", s.name)))?;
            ds.require(&format!("scorer '{}'", s.name), &f, &none)?;
        }
        if let ScorerKind::Judge { prompt, .. } = &s.kind {
            let f = template_fields(prompt)
                .map_err(|e| EvalError::Config(format!("scorer '{}': {e}", s.name)))?;
            ds.require(
                &format!("the prompt of scorer '{}'", s.name),
                &f,
                &["a", "b"].into(),
            )?;
        }
    }
    if ds.rows.is_empty() {
        return Err(EvalError::Dataset("no dataset row is usable".into()));
    }
    Ok(())
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
async fn ask(
    target: &Target,
    call: &Call,
    max_overloaded: u32,
) -> (Result<crate::target::Generation, CallError>, u32) {
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

async fn generate(
    cfg: &EvalConfig,
    v: &Variant,
    row: &Row,
    target: &Target,
    max_overloaded: u32,
) -> ResultRow {
    let mut r = blank(row, v);
    let call = match call_for(v, row) {
        Ok(c) => c,
        Err(e) => {
            r.error = Some(e.to_string());
            return r;
        }
    };
    let (res, attempts) = ask(target, &call, max_overloaded).await;
    record(cfg, row, &mut r, res.map_err(|e| e.to_string()), attempts).await;
    r
}

/// Where answers come from: a target asked directly, or workers through a job queue.
pub enum Source {
    Target(Arc<Target>),
    Queue(crate::queued::QueueSpec),
}

/// Running counters of a run, shown by the progress line.
#[derive(Default)]
pub(crate) struct Counters {
    pub done: AtomicU64,
    pub tokens: AtomicU64,
}

/// The (row, variant) pairs without an answer yet, and how many have one.
fn unanswered<'a>(
    cfg: &'a EvalConfig,
    ds: &'a Dataset,
    results: &BTreeMap<(String, String), ResultRow>,
) -> (Vec<(&'a Row, &'a Variant)>, u64) {
    let mut jobs = Vec::new();
    let mut done = 0;
    for row in &ds.rows {
        for v in &cfg.experiment.variants {
            match results.get(&(row.id.clone(), v.id.clone())) {
                Some(r) if r.ok() => done += 1,
                _ => jobs.push((row, v)),
            }
        }
    }
    (jobs, done)
}

/// What the progress line reads while answers come in.
struct Live {
    progress: Arc<Progress>,
    counters: Arc<Counters>,
    peak: Arc<AtomicU64>,
}

impl Live {
    fn ticker(&self, target: Option<Arc<Target>>, memory: bool) -> tokio::task::JoinHandle<()> {
        spawn_ticker(
            self.progress.clone(),
            target,
            memory,
            self.counters.clone(),
            self.peak.clone(),
        )
    }
}

/// Asks `target` for every job, as many at once as its capacity, handing each answer to `keep`.
async fn ask_all(
    cfg: &EvalConfig,
    jobs: Vec<(&Row, &Variant)>,
    target: &Arc<Target>,
    opts: &Options,
    live: &Live,
    keep: &mut impl FnMut(ResultRow) -> Result<(), EvalError>,
) -> Result<Capacity, EvalError> {
    let capacity = capacity(target, opts).await;
    let ticker = live.ticker(Some(target.clone()), capacity.abserve);
    let mut stream = futures::stream::iter(jobs)
        .map(|(row, v)| {
            let target = target.clone();
            async move { generate(cfg, v, row, &target, opts.max_overloaded).await }
        })
        .buffer_unordered(capacity.concurrency);
    while let Some(r) = stream.next().await {
        keep(r)?;
    }
    drop(stream);
    ticker.abort();
    Ok(capacity)
}

/// The judge's verdicts on every pair, when the experiment has a judge.
async fn judge_all(
    cfg: &EvalConfig,
    ds: &Dataset,
    results: &BTreeMap<(String, String), ResultRow>,
    judge_target: Option<Arc<Target>>,
    concurrency: usize,
    opts: &Options,
) -> Result<BTreeMap<(String, String), Judgment>, EvalError> {
    let Some(s) = cfg.judge() else {
        return Ok(BTreeMap::new());
    };
    let (ScorerKind::Judge { prompt, seed, .. }, Some(jt)) = (&s.kind, judge_target) else {
        return Err(EvalError::Config(
            "the judge scorer has no target to ask".into(),
        ));
    };
    judge_pairs(cfg, ds, results, jt, prompt, *seed, concurrency, opts).await
}

/// Runs what is not done yet and returns everything done, old and new.
pub async fn run(
    cfg: &EvalConfig,
    ds: &Dataset,
    source: Source,
    judge_target: Option<Arc<Target>>,
    opts: &Options,
) -> Result<Outcome, EvalError> {
    let started = std::time::Instant::now();
    std::fs::create_dir_all(&opts.out).map_err(EvalError::io(&opts.out))?;
    let (log, old) = Log::open::<ResultRow>(&opts.out.join("results.jsonl"))?;
    let mut results = latest(old);
    let variants: BTreeSet<&str> = cfg
        .experiment
        .variants
        .iter()
        .map(|v| v.id.as_str())
        .collect();
    let rows: BTreeMap<&str, &Row> = ds.rows.iter().map(|r| (r.id.as_str(), r)).collect();
    let judge_target = judge_for(cfg, &source, judge_target)?;

    rescore(cfg, &rows, &mut results, &log).await?;

    let (jobs, skipped_done) = unanswered(cfg, ds, &results);
    let total = jobs.len() as u64;
    if skipped_done > 0 {
        eprintln!(
            "eval: resuming: {skipped_done} answers already in {}, {total} to go",
            opts.out.display()
        );
    }
    let counters = Arc::new(Counters::default());
    let peak = Arc::new(AtomicU64::new(0));
    let progress = Arc::new(Progress::new("generate", total));
    let mut errors: Vec<String> = Vec::new();
    let live = Live {
        progress: progress.clone(),
        counters: counters.clone(),
        peak: peak.clone(),
    };
    let mut keep_one = |r| keep(r, &log, &counters, &mut errors, &mut results);
    let capacity = match &source {
        Source::Target(target) => ask_all(cfg, jobs, target, opts, &live, &mut keep_one).await?,
        Source::Queue(q) => {
            let ticker = live.ticker(None, false);
            let capacity = crate::queued::generate(cfg, jobs, q, keep_one).await;
            ticker.abort();
            capacity?
        }
    };
    progress.update(
        counters.done.load(Ordering::Relaxed),
        counters.tokens.load(Ordering::Relaxed),
        None,
    );
    progress.finish();
    print_errors(&errors);
    let generated_now = total;
    results.retain(|(row, v), _| rows.contains_key(row.as_str()) && variants.contains(v.as_str()));

    let judgments = judge_all(cfg, ds, &results, judge_target, capacity.concurrency, opts).await?;
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

/// Who judges: the judge's own endpoint, else the target that answered (a queue cannot judge).
fn judge_for(
    cfg: &EvalConfig,
    source: &Source,
    judge_target: Option<Arc<Target>>,
) -> Result<Option<Arc<Target>>, EvalError> {
    Ok(match (source, judge_target, cfg.judge()) {
        (_, Some(j), _) => Some(j),
        (Source::Target(t), None, _) => Some(t.clone()),
        (Source::Queue(_), None, Some(s)) => {
            return Err(EvalError::Config(format!("scorer '{}': with --amqp the judge needs its own `url` (workers answer the variants only)", s.name)))
        }
        (Source::Queue(_), None, None) => None,
    })
}

/// How many requests to keep in flight on a target.
async fn capacity(target: &Target, opts: &Options) -> Capacity {
    let capacity = target.capacity(opts.fallback_concurrency).await;
    match opts.concurrency {
        Some(c) => Capacity {
            concurrency: c.max(1),
            source: "--concurrency".into(),
            abserve: capacity.abserve,
        },
        None => capacity,
    }
}

/// Appends a finished answer to the run's log and counts it.
fn keep(
    r: ResultRow,
    log: &Log,
    c: &Counters,
    errors: &mut Vec<String>,
    results: &mut BTreeMap<(String, String), ResultRow>,
) -> Result<(), EvalError> {
    log.append(&r)?;
    c.tokens.fetch_add(r.completion_tokens, Ordering::Relaxed);
    c.done.fetch_add(1, Ordering::Relaxed);
    if let Some(e) = &r.error {
        errors.push(format!(
            "row {} (line {}) × {}: {e}",
            r.row, r.line, r.variant
        ));
    }
    results.insert((r.row.clone(), r.variant.clone()), r);
    Ok(())
}

/// Finished answers that lack a scorer added since the run that made them are scored now,
/// without generating again.
async fn rescore(
    cfg: &EvalConfig,
    rows: &BTreeMap<&str, &Row>,
    results: &mut BTreeMap<(String, String), ResultRow>,
    log: &Log,
) -> Result<(), EvalError> {
    for ((row_id, _), r) in results.iter_mut() {
        let Some(row) = rows.get(row_id.as_str()) else {
            continue;
        };
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
        eprintln!(
            "eval: … and {} more errors (see results.jsonl)",
            errors.len() - 10
        );
    }
}

fn spawn_ticker(
    p: Arc<Progress>,
    t: Option<Arc<Target>>,
    memory: bool,
    c: Arc<Counters>,
    peak: Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let m = match &t {
                Some(t) if memory => t.memory().await,
                _ => None,
            };
            if let Some(m) = m {
                peak.fetch_max(m, Ordering::Relaxed);
            }
            p.update(
                c.done.load(Ordering::Relaxed),
                c.tokens.load(Ordering::Relaxed),
                m,
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

/// One variant's answer beside control's on a row, for the judge.
struct Pair<'a> {
    row: &'a Row,
    variant: String,
    control: String,
    control_out: String,
    variant_out: String,
}

/// The pairs still to judge: every row where control and a variant both answered and no
/// verdict is stored yet; (row, variant, control's output, the variant's output).
fn unjudged<'a>(
    cfg: &EvalConfig,
    ds: &'a Dataset,
    results: &BTreeMap<(String, String), ResultRow>,
    judged: &BTreeMap<(String, String), Judgment>,
    control: &str,
) -> Vec<(&'a Row, String, String, String)> {
    let mut pairs = Vec::new();
    let ok = |row: &str, v: &str| {
        results
            .get(&(row.to_string(), v.to_string()))
            .filter(|r| r.ok())
    };
    for row in &ds.rows {
        let Some(c) = ok(&row.id, control) else {
            continue;
        };
        for v in cfg.experiment.variants.iter().filter(|v| v.id != control) {
            let Some(t) = ok(&row.id, &v.id) else {
                continue;
            };
            if judged
                .get(&(row.id.clone(), v.id.clone()))
                // judged in both orders (a judgment of an earlier, one-order version is asked again)
                .is_some_and(|j| j.verdict.is_some() && j.reply_swapped.is_some())
            {
                continue;
            }
            pairs.push((
                row,
                v.id.clone(),
                c.output.clone().unwrap_or_default(),
                t.output.clone().unwrap_or_default(),
            ));
        }
    }
    pairs
}

/// The judge's verdict on one pair, asked in both orders (the variant's answer as "A", then as
/// "B"); a verdict only when both agree (`judge::both_orders`).
async fn judge_one(
    target: &Target,
    prompt: &str,
    seed: u64,
    p: Pair<'_>,
    max_overloaded: u32,
) -> Judgment {
    let mut j = Judgment {
        row: p.row.id.clone(),
        variant: p.variant.clone(),
        control: p.control.clone(),
        variant_position: "both".into(),
        reply: None,
        reply_swapped: None,
        verdict: None,
        error: None,
    };
    let orders = [
        (&p.variant_out, &p.control_out),
        (&p.control_out, &p.variant_out),
    ];
    let mut replies = Vec::with_capacity(2);
    for (a, b) in orders {
        let asked = match judge::question(prompt, p.row, (a, b), seed) {
            Ok(call) => ask(target, &call, max_overloaded)
                .await
                .0
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match asked {
            Ok(g) => replies.push(g.text),
            Err(e) => {
                j.error = Some(e);
                return j;
            }
        }
    }
    j.verdict = Some(judge::both_orders(&replies[0], &replies[1]));
    j.reply_swapped = replies.pop();
    j.reply = replies.pop();
    j
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
    let pairs = unjudged(cfg, ds, results, &judged, &control);
    let progress = Progress::new("judge", pairs.len() as u64);
    let mut n = 0;
    let mut stream = futures::stream::iter(pairs)
        .map(|(row, variant, control_out, variant_out)| {
            let target = target.clone();
            let control = control.clone();
            async move {
                let pair = Pair {
                    row,
                    variant,
                    control,
                    control_out,
                    variant_out,
                };
                judge_one(&target, prompt, seed, pair, opts.max_overloaded).await
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
