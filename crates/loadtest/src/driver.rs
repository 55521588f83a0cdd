//! Sends the load: a closed loop of C clients or an open loop of Poisson arrivals, bounded by a
//! duration and/or a request count. Requests that are in flight when the bound is reached finish
//! (each within its timeout); nothing runs unbounded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use abserve_protocol::wire::{ChatRequest, Common, Message};
use abserve_protocol::Sampling;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};

use crate::client::{Class, Client, Record};
use crate::dist::Dist;
use crate::error::LoadError;
use crate::report::{Report, RunFacts};
use crate::scrape::{Sample, Scraper};
use abserve_protocol::Samples;

#[derive(Debug, Clone)]
pub enum Workload {
    /// `model = experiment:NAME`, a fresh unit per request: the server assigns variants.
    Experiment(String),
    /// N prompt variants (distinct system prompts), request i goes to variant i mod N.
    Variants(u32),
}

#[derive(Debug, Clone, Copy)]
pub enum Mode {
    Closed { concurrency: usize },
    Open { rate: f64 },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub url: String,
    pub key: Option<String>,
    pub model: Option<String>,
    pub workload: Workload,
    pub mode: Mode,
    pub duration: Option<Duration>,
    pub requests: Option<u64>,
    pub prompt_tokens: Dist,
    pub max_tokens: Dist,
    pub stream: bool,
    pub ignore_eos: bool,
    pub timeout: Duration,
    /// After the load, how long to wait for the server to drain (KV and queue back to zero).
    pub settle: Duration,
    pub seed: u64,
    /// Open loop: most requests in flight at once (arrivals wait beyond it).
    pub max_inflight: usize,
}

const WORDS: &[&str] = &[
    "the", "river", "light", "morning", "city", "garden", "window", "story", "music", "winter",
    "market", "quiet", "road", "friend", "table", "summer", "paper", "voice", "mountain", "letter",
    "bridge", "train", "coffee", "forest", "ocean", "little", "old", "green", "bright", "slow",
    "warm", "house", "dream", "stone", "cloud", "field", "yellow", "glass", "sound", "evening",
    "people", "walked", "found", "left", "under", "over", "near", "across", "every", "small",
    "long", "white", "blue", "dark", "open", "door", "song", "book", "path", "rain",
];

fn user_text(rng: &mut impl Rng, words: u32) -> String {
    let mut s = String::from("Continue this text:");
    for _ in 0..words {
        s.push(' ');
        s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
    }
    s
}

/// The chat body of request number `i` (without `stream`).
pub fn body(cfg: &Config, model: &str, i: u64, rng: &mut impl Rng) -> ChatRequest {
    let words = cfg.prompt_tokens.sample(rng);
    let mut common = Common {
        sampling: Sampling {
            max_tokens: Some(cfg.max_tokens.sample(rng).into()),
            temperature: Some(0.8),
            seed: Some(i as i64),
            ..Default::default()
        },
        ignore_eos: cfg.ignore_eos,
        ..Default::default()
    };
    let messages = match &cfg.workload {
        Workload::Experiment(name) => {
            common.model = Some(format!("experiment:{name}"));
            common.user = Some(format!("loadtest-{}", rng.gen::<u64>()));
            vec![Message::new("user", user_text(rng, words))]
        }
        Workload::Variants(n) => {
            let v = i % (*n as u64).max(1);
            common.model = Some(model.to_string());
            vec![
                Message::new(
                    "system",
                    format!("You are assistant variant {v}. Write in style number {v}."),
                ),
                Message::new("user", user_text(rng, words)),
            ]
        }
    };
    ChatRequest {
        common,
        messages,
        ..Default::default()
    }
}

/// Hands out request numbers until the duration or the request count is reached.
#[derive(Clone)]
struct Budget {
    issued: Arc<AtomicU64>,
    deadline: Option<Instant>,
    requests: Option<u64>,
}

impl Budget {
    fn next(&self) -> Option<u64> {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return None;
        }
        let i = self.issued.fetch_add(1, Ordering::SeqCst);
        if self.requests.is_some_and(|k| i >= k) {
            return None;
        }
        Some(i)
    }
}

type Records = Arc<Mutex<Vec<Record>>>;

fn push(records: &Records, rec: Record) {
    records.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
}

pub async fn run(cfg: Config) -> Result<Report, LoadError> {
    if cfg.duration.is_none() && cfg.requests.is_none() {
        return Err(LoadError::Unbounded);
    }
    // each request is bounded by cfg.timeout in Client::send; the HTTP client's own bound is a
    // backstop above it
    let api = abserve_protocol::Client::new(
        &cfg.url,
        cfg.key.clone(),
        cfg.timeout + Duration::from_secs(30),
    )?;
    let base = api.base().to_string();
    let model = match (&cfg.workload, &cfg.model) {
        (Workload::Experiment(_), _) => String::new(),
        (_, Some(m)) => m.clone(),
        _ => api.first_model().await.map_err(LoadError::NoModel)?,
    };
    let client = Arc::new(Client {
        api: api.clone(),
        timeout: cfg.timeout,
    });
    let scraper = Arc::new(Scraper::new(api));
    let before = scraper.fetch().await;
    let t0 = Instant::now();
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = before.as_ref().map(|_| {
        scraper
            .clone()
            .spawn(t0, samples.clone(), stop_sampling.clone())
    });

    let records: Records = Default::default();
    let budget = Budget {
        issued: Default::default(),
        deadline: cfg.duration.map(|d| t0 + d),
        requests: cfg.requests,
    };
    let cfg = Arc::new(cfg);
    let load = Load {
        cfg: cfg.clone(),
        client,
        model,
        budget,
        records: records.clone(),
        t0,
    };
    match cfg.mode {
        Mode::Closed { concurrency } => closed_loop(&load, concurrency).await?,
        Mode::Open { rate } => open_loop(&load, rate).await?,
    }
    let load_seconds = t0.elapsed().as_secs_f64();
    let after = match before {
        Some(_) => settle(&scraper, cfg.settle, &samples, t0).await,
        None => None,
    };
    stop_sampling.store(true, Ordering::Relaxed);
    if let Some(s) = sampler {
        let _ = s.await;
    }
    let records = std::mem::take(&mut *records.lock().unwrap_or_else(|e| e.into_inner()));
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    let facts = RunFacts {
        target: base,
        mode: match cfg.mode {
            Mode::Closed { concurrency } => format!("closed loop, {concurrency} clients"),
            Mode::Open { rate } => format!("open loop, {rate} requests/s (Poisson)"),
        },
        workload: match &cfg.workload {
            Workload::Experiment(n) => format!("experiment:{n}"),
            Workload::Variants(n) => format!("{n} variants"),
        },
        load_seconds,
        stream: cfg.stream,
    };
    Ok(Report::build(facts, records, samples, before, after))
}

/// What both loops share: the run's settings, the client, the model name, the request budget,
/// where records go and when the run began.
struct Load {
    cfg: Arc<Config>,
    client: Arc<Client>,
    model: String,
    budget: Budget,
    records: Records,
    t0: Instant,
}

/// C clients, each sending its next request when its last one ended.
async fn closed_loop(load: &Load, concurrency: usize) -> Result<(), LoadError> {
    let t0 = load.t0;
    let mut tasks = Vec::new();
    for w in 0..concurrency.max(1) {
        let (client, cfg, records, budget, model) = (
            load.client.clone(),
            load.cfg.clone(),
            load.records.clone(),
            load.budget.clone(),
            load.model.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
                cfg.seed ^ (w as u64).wrapping_mul(0x9e3779b97f4a7c15),
            );
            while let Some(i) = budget.next() {
                let rec = client
                    .send(body(&cfg, &model, i, &mut rng), cfg.stream, t0)
                    .await;
                // a turned-away client waits as told (at most a second) before its next request
                let pause = (rec.class == Class::Http429)
                    .then(|| rec.retry_after.unwrap_or(0.1).clamp(0.05, 1.0));
                push(&records, rec);
                if let Some(p) = pause {
                    tokio::time::sleep(Duration::from_secs_f64(p)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    Ok(())
}

/// Poisson arrivals at `rate` per second, at most `max_inflight` at once.
async fn open_loop(load: &Load, rate: f64) -> Result<(), LoadError> {
    let (cfg, t0) = (&load.cfg, load.t0);
    let exp = match Exp::new(rate) {
        Ok(e) if rate.is_finite() && rate > 0.0 => e,
        _ => return Err(LoadError::Rate(rate)),
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(cfg.seed);
    let gate = Arc::new(tokio::sync::Semaphore::new(cfg.max_inflight.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let mut next = Instant::now();
    while let Some(i) = load.budget.next() {
        tokio::time::sleep_until(next.into()).await;
        next += Duration::from_secs_f64(exp.sample(&mut rng));
        // the gate is never closed, so acquiring only waits
        let Ok(permit) = gate.clone().acquire_owned().await else {
            break;
        };
        let b = body(cfg, &load.model, i, &mut rng);
        let (client, records, stream) = (load.client.clone(), load.records.clone(), cfg.stream);
        tasks.spawn(async move {
            push(&records, client.send(b, stream, t0).await);
            drop(permit);
        });
    }
    while let Some(r) = tasks.join_next().await {
        r?;
    }
    Ok(())
}

/// Lets the server drain (KV, running and waiting back to zero, or `settle` passed), then takes
/// the final sample and the counters after the load.
async fn settle(
    scraper: &Scraper,
    settle: Duration,
    samples: &Arc<Mutex<Vec<Sample>>>,
    t0: Instant,
) -> Option<Samples> {
    let until = Instant::now() + settle;
    loop {
        let m = scraper.fetch().await;
        let idle = m.as_ref().is_some_and(|m| {
            let s = Scraper::sample(m, 0.0);
            s.kv_cells_used == 0.0 && s.running == 0.0 && s.waiting == 0.0
        });
        if idle || Instant::now() >= until {
            if let Some(m) = &m {
                samples
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Scraper::sample(m, t0.elapsed().as_secs_f64()));
            }
            return m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
