//! A model served elsewhere — vLLM, SGLang, TGI, llama.cpp's server, Ollama, another abserve,
//! OpenAI or another hosted OpenAI-compatible API, or Anthropic's Messages API — as a registry
//! entry ([`Upstream`]), behind the same experiments as a local model.
//!
//! - `config`: what the operator says (`--upstream ID=URL`, `[[upstream]]` tables);
//! - `discover`: what the upstream says about itself (slots, KV tokens, context, counting);
//! - `admit`: a group from submission to admission (counting, `max_tokens`, the pool);
//! - `pool`: admission against that capacity, over its replicas, in arrival order;
//! - `breaker`: one circuit breaker per URL;
//! - `call`: one request relayed as engine events, with retries before the first token
//!   (`openai` and `anthropic` read the two protocols' streams, `relay` what was sent);
//! - `saturation`: the upstream's own load, scraped from its `/metrics`;
//! - `series`: its `/metrics` series.
//!
//! Invariants: abserve never has more requests at an upstream replica than its sequence slots,
//! nor more tokens (prompt + `max_tokens` of every running request) than its KV capacity:
//! every request carries an explicit `max_tokens`, reserved before it is sent and given back
//! when it ends (`pool`). A request waits for that room in arrival order within the server's
//! queue timeout, exactly as for a local model (the first event is `Admitted`). The API key is
//! sent in a header and nowhere else: no error, log line or series carries it.

mod admit;
mod anthropic;
mod breaker;
mod call;
mod config;
mod discover;
mod openai;
mod pool;
mod relay;
mod saturation;
mod series;

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abserve_engine::prepare::{sampling_params, Input, Options, PrepareError};
use abserve_engine::tools::{tool_use, ToolFormat};
use abserve_engine::{ChatMessage, Event, Placement, StatsSnapshot, SubmitError};
use abserve_protocol::{Sampling, Structure};
use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub use breaker::Breaker;
pub use config::{Protocol, UpstreamConfig};
pub use discover::{bound, Counting};
pub use pool::{Limits, Pool, Replica};
pub use series::Series;

use crate::registry::{Capacity, Model, Prepared};

/// A model served elsewhere, as a registry entry.
pub struct Upstream {
    shared: Arc<Shared>,
}

/// What every request to one upstream shares.
pub(crate) struct Shared {
    pub id: String,
    pub config: UpstreamConfig,
    /// The model's name at the upstream.
    pub model: String,
    pub engine: &'static str,
    pub counting: Counting,
    /// Whether an unset `max_tokens` is set to the room the context leaves (the context is
    /// known) or left to the upstream (a hosted API that said nothing: reserved as 1 token).
    pub fills_max_tokens: bool,
    pub http: reqwest::Client,
    pub pool: Arc<Pool>,
    pub max_queue: usize,
    pub waiting: AtomicUsize,
    pub running: AtomicUsize,
    pub order: AtomicU64,
    pub counters: Counters,
    pub series: Arc<Series>,
    probe: tokio::sync::Mutex<Option<(Instant, Result<(), String>)>>,
}

/// Counts of one upstream (the model's stats; the rest are its [`Series`]).
#[derive(Default)]
pub struct Counters {
    pub completed: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
}

/// One sequence as this entry runs it.
struct Job {
    /// OpenAI's form of the conversation.
    messages: Value,
    /// The upper bound on its prompt tokens ([`bound`]).
    bound: usize,
    /// Everything else the upstream is asked (sampling, `response_format`, tools).
    body: Map<String, Value>,
    /// The request's or its variant's `max_tokens`.
    max_tokens: Option<usize>,
    /// The endpoint's `max_tokens` when unset (at most the room the context leaves).
    default_max: usize,
    /// A hash of the conversation's first message (a variant's system prompt), for replica
    /// affinity.
    affinity: Option<u64>,
}

impl Upstream {
    /// Connects to what `config` names: finds the model's name there when not given and each
    /// URL's capacity ([`discover`]); fails when no URL answers or a key cannot be read.
    pub async fn connect(
        config: UpstreamConfig,
        max_queue: Option<usize>,
    ) -> Result<Upstream, String> {
        let key = config.api_key()?;
        let (connect, _, _) = config.timeouts();
        let http = client(&config, key.as_deref())?;
        let urls = config.urls();
        let model = match &config.model {
            Some(m) => m.clone(),
            None => first_model(&http, &urls[0], connect)
                .await
                .map_err(|e| format!("upstream '{}': {e} (give its `model`)", config.id))?,
        };
        let mut replicas = vec![];
        let mut found = None;
        for url in &urls {
            let f =
                tokio::time::timeout(connect * 4, discover::discover(&http, url, &model, &config))
                    .await
                    .map_err(|_| {
                        format!(
                            "upstream '{}': {url} did not answer within {:?}",
                            config.id,
                            connect * 4
                        )
                    })?;
            let breaker = Breaker::new(
                config.breaker_failures,
                Duration::from_secs_f64(config.breaker_cooldown),
            );
            replicas.push(Replica::new(url.clone(), f.limits, breaker));
            found.get_or_insert(f);
        }
        let found = found.expect("a config names at least one URL");
        let series = Arc::new(Series::new(&config.id));
        for r in &replicas {
            let url = [r.url.as_str()];
            series
                .token_capacity
                .with_label_values(&url)
                .set(r.limits.tokens as i64);
            series
                .seq_slots
                .with_label_values(&url)
                .set(r.limits.seqs as i64);
            series.in_flight.with_label_values(&url).set(0);
            series.tokens.with_label_values(&url).set(0);
            series.breaker.with_label_values(&url).set(0);
            series.saturated.with_label_values(&url).set(0);
        }
        let pool = Pool::new(replicas, Some(series.clone()));
        let seqs: usize = pool.replicas.iter().map(|r| r.limits.seqs).sum();
        let shared = Arc::new(Shared {
            id: config.id.clone(),
            model,
            engine: found.engine,
            counting: found.counting,
            fills_max_tokens: found.context_known,
            http,
            pool,
            max_queue: max_queue.unwrap_or(2 * seqs),
            waiting: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            order: AtomicU64::new(0),
            counters: Counters::default(),
            series,
            probe: tokio::sync::Mutex::new(None),
            config,
        });
        saturation::spawn(&shared);
        Ok(Upstream { shared })
    }

    /// Which engine it found (`llama.cpp`, `vllm`, …, `openai-compatible`).
    pub fn engine(&self) -> &'static str {
        self.shared.engine
    }

    pub fn pool(&self) -> &Pool {
        &self.shared.pool
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }
}

/// The HTTP client of one upstream: its headers (the key marked sensitive, so that no debug
/// output shows it), its connect timeout, the system's roots for https.
fn client(config: &UpstreamConfig, key: Option<&str>) -> Result<reqwest::Client, String> {
    let (connect, _, _) = config.timeouts();
    let mut headers = reqwest::header::HeaderMap::new();
    for (k, v) in &config.headers {
        let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
            .map_err(|_| format!("upstream '{}': '{k}' is not a header name", config.id))?;
        let value = reqwest::header::HeaderValue::from_str(v).map_err(|_| {
            format!(
                "upstream '{}': the value of header '{k}' is not valid",
                config.id
            )
        })?;
        headers.insert(name, value);
    }
    if let Some(key) = key {
        let (name, value) = match config.protocol {
            Protocol::Openai => ("authorization", format!("Bearer {key}")),
            Protocol::Anthropic => ("x-api-key", key.to_string()),
        };
        let mut v = reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
            format!(
                "upstream '{}': the API key holds characters a header cannot",
                config.id
            )
        })?;
        v.set_sensitive(true);
        headers.insert(name, v);
    }
    if config.protocol == Protocol::Anthropic {
        headers.insert(
            "anthropic-version",
            reqwest::header::HeaderValue::from_static("2023-06-01"),
        );
    }
    // https upstreams are verified against the system's roots (an operator's private CA
    // included), not a bundled set
    reqwest::Client::builder()
        .tls_built_in_webpki_certs(false)
        .tls_built_in_native_certs(true)
        .connect_timeout(connect)
        .default_headers(headers)
        .build()
        .map_err(|e| format!("upstream '{}': {e}", config.id))
}

/// The first model an OpenAI-compatible endpoint lists.
async fn first_model(
    http: &reqwest::Client,
    url: &str,
    timeout: Duration,
) -> Result<String, String> {
    let base = discover::base(url);
    let r = tokio::time::timeout(timeout * 4, http.get(format!("{base}/models")).send())
        .await
        .map_err(|_| format!("{base}/models did not answer"))?
        .map_err(|e| format!("{base}/models: {}", call::without_url(&e)))?;
    let status = r.status();
    let v: Value = r
        .json()
        .await
        .map_err(|_| format!("{base}/models answered {status} without a model list"))?;
    v["data"][0]["id"]
        .as_str()
        .map(String::from)
        .ok_or_else(|| format!("{base}/models lists no model"))
}

/// OpenAI's form of a conversation.
fn messages_json(messages: &[ChatMessage]) -> Value {
    Value::Array(
        messages
            .iter()
            .map(|m| {
                let mut o = json!({"role": m.role, "content": m.content});
                if !m.tool_calls.is_empty() {
                    o["tool_calls"] = json!(m.tool_calls);
                    if m.content.is_empty() {
                        o["content"] = Value::Null;
                    }
                }
                if let Some(id) = &m.tool_call_id {
                    o["tool_call_id"] = json!(id);
                }
                o
            })
            .collect(),
    )
}

/// The sampling fields a request or variant set, under their OpenAI names (abserve's extensions
/// that vLLM, SGLang and llama.cpp also take — `top_k`, `min_p`, `repetition_penalty` — keep
/// theirs).
fn sampling_json(s: &Sampling) -> Map<String, Value> {
    let mut v = serde_json::to_value(s).unwrap_or_default();
    let mut m = std::mem::take(v.as_object_mut().unwrap_or(&mut Map::new()));
    m.remove("max_tokens");
    m.remove("adapters");
    m
}

impl Model for Upstream {
    fn owned_by(&self) -> &str {
        self.shared.engine
    }

    fn origin(&self) -> String {
        let urls: Vec<String> = self
            .shared
            .pool
            .replicas
            .iter()
            .map(|r| r.url.clone())
            .collect();
        format!("'{}' at {}", self.shared.model, urls.join(", "))
    }

    fn capacity(&self) -> Capacity {
        let p = &self.shared.pool;
        Capacity {
            context: p.context(),
            seq_slots: p.replicas.iter().map(|r| r.limits.seqs).sum(),
            max_queue: self.shared.max_queue,
        }
    }

    fn stats(&self) -> StatsSnapshot {
        let c = &self.shared.counters;
        StatsSnapshot {
            running: self.shared.running.load(Ordering::SeqCst) as u64,
            waiting: self.shared.waiting.load(Ordering::SeqCst) as u64,
            completed: c.completed.load(Ordering::SeqCst),
            prompt_tokens: c.prompt_tokens.load(Ordering::SeqCst),
            generated_tokens: c.generated_tokens.load(Ordering::SeqCst),
            ..Default::default()
        }
    }

    fn alive(&self) -> Result<(), String> {
        Ok(())
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        self.shared.series.collectors()
    }

    fn priced(&self) -> bool {
        self.shared.config.priced()
    }

    fn max_cost(&self, seq: &Prepared) -> Option<f64> {
        let j = seq.job::<Job>()?;
        let c = &self.shared.config;
        let out = j.max_tokens?;
        c.priced()
            .then(|| (j.bound as f64 * c.input_price + out as f64 * c.output_price) / 1e6)
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let mut cached = self.shared.probe.lock().await;
            if let Some((at, r)) = &*cached {
                let reuse = Duration::from_secs_f64(self.shared.config.probe_interval);
                if at.elapsed() < reuse && r.is_ok() {
                    return r.clone();
                }
            }
            let r = call::probe(&self.shared).await;
            *cached = Some((Instant::now(), r.clone()));
            r
        })
    }

    fn prepare(
        &self,
        input: Input<'_>,
        sampling: &Sampling,
        structure: &Structure,
        options: &Options,
        _max_prompt_tokens: usize,
    ) -> Result<Prepared, PrepareError> {
        let id = &self.shared.id;
        let Input::Chat(messages) = input else {
            return Err(PrepareError::new(
                "prompt",
                format!("'{id}' is served elsewhere and takes chat completions only (/v1/chat/completions)"),
            ));
        };
        // the same ranges as for a local model: what abserve accepts is forwarded
        sampling_params(sampling, options)?;
        if sampling.adapters.is_some() {
            return Err(PrepareError::new(
                "adapters",
                format!(
                    "'{id}' is served elsewhere: LoRA adapters are for models this process runs"
                ),
            ));
        }
        if options.logprobs.is_some() {
            return Err(PrepareError::new(
                "logprobs",
                format!("log-probabilities are not relayed from '{id}', a model served elsewhere"),
            ));
        }
        let tools = tool_use(
            structure.tools.as_deref(),
            structure.tool_choice.as_ref(),
            structure.parallel_tool_calls,
            ToolFormat::Hermes,
        )?;
        let mut body = sampling_json(sampling);
        if let Value::Object(s) = serde_json::to_value(structure).unwrap_or_default() {
            body.extend(s);
        }
        if options.ignore_eos {
            body.insert("ignore_eos".into(), Value::Bool(true));
        }
        let affinity = messages.first().map(|m| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (&m.role, &m.content).hash(&mut h);
            h.finish()
        });
        let job = Job {
            messages: messages_json(messages),
            bound: bound(messages.iter().map(|m| m.content.as_str())),
            body,
            max_tokens: sampling.max_tokens.map(|m| m as usize),
            default_max: options.default_max_tokens as usize,
            affinity,
        };
        Ok(Prepared::new(job, vec![], tools))
    }

    fn check(
        &self,
        sampling: &Sampling,
        structure: &Structure,
        probe: &[ChatMessage],
    ) -> Result<(), PrepareError> {
        self.prepare(
            Input::Chat(probe),
            sampling,
            structure,
            &Options::new(16),
            usize::MAX,
        )
        .map(|_| ())
    }

    fn submit(
        &self,
        seqs: Vec<Prepared>,
        at: Placement,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError> {
        let sh = &self.shared;
        let cap = self.capacity();
        if seqs.len() > cap.seq_slots + cap.max_queue || !sh.pool.fits(&vec![1; seqs.len()]) {
            return Err(SubmitError::GroupTooLarge {
                group: seqs.len(),
                capacity: cap.seq_slots.min(
                    sh.pool
                        .replicas
                        .iter()
                        .map(|r| r.limits.seqs)
                        .max()
                        .unwrap_or(0),
                ),
                slots: cap.seq_slots,
                queue: cap.max_queue,
            });
        }
        // as for a local model: running requests fill the slots, beyond slots + max_queue in
        // flight the queue is full (so `--max-queue 0` refuses only what would have to wait)
        let waiting = sh.waiting.load(Ordering::SeqCst);
        let running = sh.running.load(Ordering::SeqCst);
        if running + waiting + seqs.len() > cap.seq_slots + sh.max_queue {
            return Err(SubmitError::QueueFull(sh.max_queue));
        }
        let mut jobs = vec![];
        for s in &seqs {
            let Some(j) = s.job::<Job>() else {
                return Err(SubmitError::Invalid(
                    "model",
                    "the request was prepared for another model".into(),
                ));
            };
            let max = match (j.max_tokens, sh.fills_max_tokens) {
                (Some(m), _) => (m, true),
                (None, false) => (0, true),
                (None, true) => (j.default_max, false),
            };
            jobs.push((j.messages.clone(), j.bound, j.body.clone(), max, j.affinity));
        }
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..seqs.len()).map(|_| unbounded_channel()).unzip();
        sh.waiting.fetch_add(seqs.len(), Ordering::SeqCst);
        let guard = admit::Waiting(sh.clone(), seqs.len());
        tokio::spawn(admit::run_group(sh.clone(), jobs, txs, guard, at.class));
        Ok(rxs)
    }
}
