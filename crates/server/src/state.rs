//! Shared server state and the admission path every generation goes through:
//! validation → bounded queue (429 + Retry-After) → wait for admission (queue timeout) → events.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abserve_engine::{Event, Request, SubmitError};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine_api::EngineApi;
use crate::error::ApiError;
use crate::metrics::Metrics;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub model_id: String,
    pub queue_timeout: Duration,
    pub api_key: Option<String>,
    pub body_limit: usize,
    /// Longest prompt accepted, in tokens (besides the context limit).
    pub max_prompt_tokens: usize,
    pub ready_cache: Duration,
    pub drain_timeout: Duration,
    /// A connection must send its request head within this (slow-loris clients are closed).
    pub header_read_timeout: Duration,
    /// Origins allowed by CORS (`--cors-origin`); none: no CORS headers.
    pub cors_origins: Vec<String>,
    /// How often running experiments' guardrails are checked (`guardrails.rs`).
    pub guardrail_interval: Duration,
}

/// What the sequences of a group are, for the 400 that says it can never be accepted whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOf {
    /// A fan-out: one per variant.
    Variants,
    /// `n` choices of one prompt.
    Choices,
    /// Several prompts of a completions request (× `n`).
    Completions,
}

/// One sequence of a group: its events and, once it was admitted, its engine-wide admission
/// order (the `Admitted` event was read); `None` for a member of a group larger than the slots
/// that is admitted later (its `Admitted` event is still in `rx`).
pub struct Admitted {
    pub rx: UnboundedReceiver<Event>,
    pub order: Option<u64>,
}

/// A model served beside the default one (`--model ID=FILE`, repeated): requests name it by
/// its id in `model`, variants by `model = "ID"`; it has its own engine, plan and KV cache.
pub struct OtherModel {
    pub id: String,
    pub engine: Box<dyn EngineApi>,
}

pub struct AppState {
    /// The default model's engine (the first `--model`; a fake one in the server's unit tests):
    /// every request that names no other model goes to it.
    pub engine: Box<dyn EngineApi>,
    /// The models served beside it, in `--model` order (model index 1, 2, …).
    pub others: Vec<OtherModel>,
    pub metrics: Arc<Metrics>,
    pub config: ServerConfig,
    pub shutting_down: AtomicBool,
    pub started: Instant,
    /// Requests completed per second, smoothed (×1000), for Retry-After.
    drain_rate_milli: AtomicU64,
    pub ready:
        tokio::sync::Mutex<Option<(Instant, Result<abserve_protocol::abserve::Ready, String>)>>,
    /// The A/B layer, when the server was started with a data directory.
    pub ab: Option<crate::abstate::AbState>,
    /// Slots of the blocking pool for request preparation (see [`AppState::prepare`]).
    prep: tokio::sync::Semaphore,
}

impl AppState {
    pub fn new(
        engine: impl EngineApi,
        metrics: Arc<Metrics>,
        config: ServerConfig,
        ab: Option<crate::abstate::AbState>,
    ) -> Arc<Self> {
        Self::with_models(engine, vec![], metrics, config, ab)
    }

    /// A server of several models: `engine` is the default one's (its id `config.model_id`).
    pub fn with_models(
        engine: impl EngineApi,
        others: Vec<OtherModel>,
        metrics: Arc<Metrics>,
        config: ServerConfig,
        ab: Option<crate::abstate::AbState>,
    ) -> Arc<Self> {
        let state = Arc::new(AppState {
            engine: Box::new(engine),
            others,
            metrics,
            config,
            shutting_down: AtomicBool::new(false),
            started: Instant::now(),
            drain_rate_milli: AtomicU64::new(0),
            ready: tokio::sync::Mutex::new(None),
            ab,
            prep: tokio::sync::Semaphore::new(Self::prep_slots()),
        });
        state.pin_adapters();
        state
    }

    /// Keeps the adapters that experiments' active variants name loaded while they name them
    /// (the default model's budget asks at each admission that needs room; a weak reference, so
    /// the budget does not keep the server alive).
    fn pin_adapters(self: &Arc<Self>) {
        let Some(budget) = self.engine.adapters() else {
            return;
        };
        let weak = Arc::downgrade(self);
        budget.pin_with(Box::new(move || {
            let Some(st) = weak.upgrade() else {
                return vec![];
            };
            let Some(ab) = &st.ab else { return vec![] };
            let mut names = vec![];
            for e in ab.list() {
                for v in e.variants.iter().filter(|v| v.stopped.is_none()) {
                    if st.variant_model(v).is_ok_and(|m| m == 0) {
                        let s = v.sampling();
                        names.extend(s.adapters.unwrap_or_default().into_iter().map(|a| a.path));
                    }
                }
            }
            names
        }));
    }

    /// Half the cores (at least one): the other half keeps answering `/health` and streaming
    /// tokens while hostile requests are parsed and rendered.
    fn prep_slots() -> usize {
        std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
    }

    /// Runs CPU-bound preparation of a request (parsing a body of up to the body limit,
    /// rendering templates, tokenizing) on the blocking pool, a bounded number at once. A client
    /// with a huge body or a thousand messages waits for a slot; the async threads that answer
    /// `/health` and stream tokens never run this work.
    pub async fn prepare<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&AppState) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let _slot = self
            .prep
            .acquire()
            .await
            .map_err(|_| ApiError::unavailable("The server is shutting down."))?;
        let st = self.clone();
        tokio::task::spawn_blocking(move || f(&st))
            .await
            .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
    }

    /// The index of the model a request or a variant names (0: the default model, also named
    /// `default`), or None for a model this server does not serve.
    pub fn model_index(&self, id: &str) -> Option<usize> {
        if id == self.config.model_id || id == "default" {
            return Some(0);
        }
        self.others.iter().position(|m| m.id == id).map(|i| i + 1)
    }

    /// The model a variant generates with (`model = "ID"`; the default without one), or a 400
    /// naming `variants.ID.model` for a model this server does not serve.
    pub fn variant_model(&self, v: &abserve_ab::Variant) -> Result<usize, ApiError> {
        let Some(m) = &v.model else { return Ok(0) };
        self.model_index(m).ok_or_else(|| {
            ApiError::invalid_param(
                &format!("variants.{}.model", v.id),
                format!(
                    "variant '{}' names the model '{m}', which this server does not serve (it serves {})",
                    v.id,
                    self.model_ids().join(", ")
                ),
            )
        })
    }

    /// The engine of model `i` (see [`AppState::model_index`]).
    pub fn engine_at(&self, i: usize) -> &dyn EngineApi {
        match i {
            0 => &*self.engine,
            i => &*self.others[i - 1].engine,
        }
    }

    /// Every model's id, the default first.
    pub fn model_ids(&self) -> Vec<String> {
        std::iter::once(self.config.model_id.clone())
            .chain(self.others.iter().map(|m| m.id.clone()))
            .collect()
    }

    /// Every model's engine, the default first.
    pub fn engines(&self) -> impl Iterator<Item = &dyn EngineApi> {
        (0..=self.others.len()).map(|i| self.engine_at(i))
    }

    /// The context a request to model `i` must fit (its plan's, and `--max-prompt-tokens`).
    pub fn limits(&self, i: usize) -> abserve_engine::prepare::Limits {
        abserve_engine::prepare::Limits {
            context: self.engine_at(i).plan().context as usize,
            max_prompt_tokens: self.config.max_prompt_tokens,
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Samples completions once a second; Retry-After divides the queue by this rate.
    pub fn spawn_drain_meter(self: &Arc<Self>) {
        let st = self.clone();
        tokio::spawn(async move {
            let completed = |st: &AppState| st.engines().map(|e| e.stats().completed).sum::<u64>();
            let mut last = completed(&st);
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let now = completed(&st);
                let rate = (now - last) as f64;
                last = now;
                let old = st.drain_rate_milli.load(Ordering::Relaxed) as f64 / 1000.0;
                let ewma = if old == 0.0 {
                    rate
                } else {
                    0.7 * old + 0.3 * rate
                };
                st.drain_rate_milli
                    .store((ewma * 1000.0) as u64, Ordering::Relaxed);
            }
        });
    }

    /// Every 30 s, each experiment's sample-ratio-mismatch p-value into `/metrics` (from the
    /// store's count of units per variant; a failing store leaves the last values).
    pub fn spawn_srm_meter(self: &Arc<Self>) {
        let st = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            loop {
                tick.tick().await;
                let Some(ab) = st.ab.as_ref() else { return };
                for e in ab.list() {
                    if let Ok(units) = ab.store().units(&e.name).await {
                        let observed: Vec<u64> = e
                            .variants
                            .iter()
                            .map(|v| units.get(&v.id).copied().unwrap_or(0))
                            .collect();
                        // NaN until the experiment has units to test
                        let p = abserve_statistics::srm(&observed, &e.weights())
                            .map_or(f64::NAN, |s| s.p_value);
                        st.metrics
                            .experiment_srm
                            .with_label_values(&[e.name.as_str()])
                            .set(p);
                    }
                }
            }
        });
    }

    /// Keeps the experiments this replica routes in step with the store (see `abstate`).
    pub fn spawn_experiment_sync(self: &Arc<Self>) {
        let st = self.clone();
        tokio::spawn(async move {
            if let Some(ab) = st.ab.as_ref() {
                ab.sync().await;
            }
        });
    }

    /// Seconds until the queue has room, from the current drain rate.
    pub fn retry_after(&self) -> u64 {
        let rate = self.drain_rate_milli.load(Ordering::Relaxed) as f64 / 1000.0;
        let ahead = self
            .engines()
            .map(|e| e.stats())
            .map(|s| s.waiting + s.running)
            .sum::<u64>() as f64
            + 1.0;
        if rate <= 0.01 {
            return 2;
        }
        (ahead / rate).ceil().clamp(1.0, 60.0) as u64
    }

    /// Submits to model `i` without waiting for admission (the first event will be `Admitted`).
    fn enqueue_nowait(&self, i: usize, req: Request) -> Result<UnboundedReceiver<Event>, ApiError> {
        self.refuse_when_shutting_down()?;
        self.engine_at(i)
            .submit(req)
            .map_err(|e| self.refused(e, GroupOf::Choices))
    }

    /// Submits requests that need several sequences (a fan-out, `n` choices, a multi-prompt
    /// completion) as one group: all enter the engine, or none (a 429 when the slots and the
    /// queue have no room for all now, a 400 when they never can). A group that fits the slots
    /// is admitted together, in one step; this waits for that within the queue timeout (a 429
    /// after it, every receiver dropped, none of the group having run). A larger group can
    /// never run at once: it holds its places in the queue, and this waits for its first
    /// member; the rest run as slots free. Model `i`'s engine takes the group.
    pub async fn admit_group(
        &self,
        i: usize,
        mut reqs: Vec<Request>,
        what: GroupOf,
    ) -> Result<Vec<Admitted>, ApiError> {
        self.refuse_when_shutting_down()?;
        let mut rxs = match reqs.len() {
            1 => vec![self.enqueue_nowait(i, reqs.remove(0))?],
            _ => self
                .engine_at(i)
                .submit_group(reqs)
                .map_err(|e| self.refused(e, what))?,
        };
        let deadline = tokio::time::sleep(self.config.queue_timeout);
        tokio::pin!(deadline);
        let together = abserve_engine::admitted_together(
            rxs.len(),
            self.engine_at(i).plan().seq_slots as usize,
        );
        let wait_for = if together { rxs.len() } else { 1 };
        let mut admitted = Vec::with_capacity(rxs.len());
        for mut rx in rxs.drain(..) {
            if admitted.len() >= wait_for {
                // admitted later, as slots free; its `Admitted` event stays in its stream
                admitted.push(Admitted { rx, order: None });
                continue;
            }
            let order = tokio::select! {
                ev = rx.recv() => match ev {
                    Some(Event::Admitted { order, .. }) => order,
                    Some(Event::Error(e)) => return Err(ApiError::generation(e)),
                    Some(_) | None => return Err(ApiError::unavailable("The engine stopped.")),
                },
                _ = &mut deadline => {
                    self.metrics.reject("queue_timeout");
                    return Err(ApiError::overloaded(
                        format!("The request waited longer than the queue timeout of {:?}.", self.config.queue_timeout),
                        self.retry_after(),
                    ));
                }
            };
            admitted.push(Admitted {
                rx,
                order: Some(order),
            });
        }
        Ok(admitted)
    }

    fn refuse_when_shutting_down(&self) -> Result<(), ApiError> {
        if self.is_shutting_down() {
            self.metrics.reject("shutting_down");
            return Err(ApiError::unavailable("The server is shutting down."));
        }
        Ok(())
    }

    /// The answer to a request the engine did not take.
    fn refused(&self, e: SubmitError, what: GroupOf) -> ApiError {
        match e {
            SubmitError::QueueFull(n) => {
                self.metrics.reject("queue_full");
                ApiError::overloaded(
                    format!("The server is at capacity ({n} requests waiting). Retry after the delay in Retry-After."),
                    self.retry_after(),
                )
            }
            SubmitError::GroupTooLarge {
                group,
                capacity,
                slots,
                queue,
            } => {
                let (param, has, advice) = match what {
                    GroupOf::Variants => (
                        "variants",
                        "This fan-out has {group} variants",
                        "or split the experiment",
                    ),
                    GroupOf::Choices => (
                        "n",
                        "This request asks for {group} choices (n)",
                        "or ask for fewer choices",
                    ),
                    GroupOf::Completions => (
                        "prompt",
                        "This request asks for {group} completions (prompts × n)",
                        "or send fewer prompts",
                    ),
                };
                let has = has.replace("{group}", &group.to_string());
                ApiError::invalid_param(
                    param,
                    format!(
                        "{has} but the server holds at most {capacity} sequences at once ({slots} sequence slots + {queue} queued), so it could never be accepted whole; raise --max-sequences or --max-queue, {advice}."
                    ),
                )
            }
            SubmitError::ShuttingDown => {
                self.metrics.reject("shutting_down");
                ApiError::unavailable("The server is shutting down.")
            }
            SubmitError::PromptTooLong { prompt, context } => {
                self.metrics.reject("too_long");
                ApiError::invalid_param(
                    "messages",
                    format!("The prompt has {prompt} tokens but the context is {context} tokens."),
                )
            }
            SubmitError::EmptyPrompt => ApiError::invalid_param("prompt", "The prompt is empty."),
            SubmitError::Invalid(p, m) => ApiError::invalid_param(p, m),
        }
    }
}
