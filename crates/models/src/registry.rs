//! The model registry: every model this process serves, by id, the default first — the one
//! place that knows "the models of this process". Serve (chat, completions, fan-out,
//! `/v1/models`, `/health`, `/ready`, `/metrics`, the dashboard), eval in process, the worker and
//! `generate` all read it.
//!
//! Each entry answers at the request level ([`Model`]): prepare one sequence of a request for
//! it (what needs the model's template, vocabulary and context), run prepared sequences as one
//! group (all of them or none), and say its capacity, its figures and whether it is alive and
//! ready. How it does that is its own: the engine in this process ([`crate::Local`]) tokenizes
//! here and plans memory; a model that tokenizes elsewhere keeps its own form of the request
//! in [`Prepared`] and leaves its `prompt` empty. Callers never ask which kind they hold.
//!
//! Invariants: a registry is never empty; ids are unique; the first entry is the default one
//! (also reachable as `default`); entries do not change once the process has started.

use std::any::Any;
use std::sync::Arc;

use abserve_engine::plan::MemoryPlan;
use abserve_engine::prepare::{Input, Options, PrepareError};
use abserve_engine::tools::ToolUse;
use abserve_engine::{ChatMessage, Event, Placement, StatsSnapshot, SubmitError};
use abserve_protocol::{Sampling, Structure};
use futures::future::BoxFuture;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine_api::EngineApi;

/// How much a model holds: the context of one sequence, the sequences it runs at once and the
/// sequences that may wait beyond those before it refuses more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Tokens of one sequence (prompt and answer).
    pub context: usize,
    pub seq_slots: usize,
    pub max_queue: usize,
}

/// One sequence of a request, prepared by the model that will run it.
#[derive(Clone)]
pub struct Prepared {
    /// The prompt's token ids where this process tokenized it; empty for a model that tokenizes
    /// elsewhere (its answer's usage counts them).
    pub prompt: Vec<i32>,
    /// How the answer's text becomes tool calls (a chat with tools).
    pub tools: Option<ToolUse>,
    /// Log-probabilities asked for, with this many alternatives.
    pub logprobs: Option<u32>,
    /// The model's own form of the sequence, read back only by the model that made it.
    job: Arc<dyn Any + Send + Sync>,
}

impl Prepared {
    /// A sequence carrying `job`, the model's own form of it (see [`Prepared::job`]).
    pub fn new(job: impl Any + Send + Sync, prompt: Vec<i32>, tools: Option<ToolUse>) -> Self {
        Prepared {
            prompt,
            tools,
            logprobs: None,
            job: Arc::new(job),
        }
    }

    /// The model's own form of the sequence, when it is a `T` (a model reads back what it made).
    pub fn job<T: Any>(&self) -> Option<&T> {
        self.job.downcast_ref::<T>()
    }
}

/// What every model in the registry answers, at the request level.
pub trait Model: Send + Sync + 'static {
    /// Who serves it, as `/v1/models` says (`owned_by`).
    fn owned_by(&self) -> &str;
    /// Where it comes from, for people (a model file, an endpoint).
    fn origin(&self) -> String;
    fn capacity(&self) -> Capacity;
    /// The memory plan it runs under, when this process runs it.
    fn plan(&self) -> Option<&MemoryPlan> {
        None
    }
    /// Sequences waiting and running, tokens and completions so far.
    fn stats(&self) -> StatsSnapshot;
    /// Liveness: `Err(why)` once it can no longer answer.
    fn alive(&self) -> Result<(), String>;
    /// Readiness: a real 1-token answer (and whatever else the model needs to be sure of).
    fn probe(&self) -> BoxFuture<'_, Result<(), String>>;
    /// One sequence of a request: `input` under `sampling` and `structure`, refused with the
    /// field named when the model cannot take it (a prompt longer than `max_prompt_tokens` or
    /// than the context included). CPU-bound (templates, tokenizing, grammars): callers run it
    /// off their async threads.
    fn prepare(
        &self,
        input: Input<'_>,
        sampling: &Sampling,
        structure: &Structure,
        options: &Options,
        max_prompt_tokens: usize,
    ) -> Result<Prepared, PrepareError>;
    /// Whether a variant's settings can serve, before any request: its sampling, its
    /// `response_format` and tools, its template's rendering of `probe`, its adapters.
    fn check(
        &self,
        sampling: &Sampling,
        structure: &Structure,
        probe: &[ChatMessage],
    ) -> Result<(), PrepareError>;
    /// Runs prepared sequences as one group (a fan-out, `n` choices, several prompts): all of
    /// them or none; each answers on its own channel, the first event `Admitted`. Dropping a
    /// receiver cancels its sequence. `at` places them among the model's other requests: an
    /// experiment's fairness group and share of the model's memory, their priority class.
    fn submit(
        &self,
        seqs: Vec<Prepared>,
        at: Placement,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError>;
    /// Whether its answers have a price (a model served elsewhere with prices configured):
    /// their cost is in `Completion::cost`.
    fn priced(&self) -> bool {
        false
    }
    /// The most a prepared sequence's answer can cost at its prices (a bound on the prompt's
    /// tokens and the sequence's `max_tokens`); `None` when unpriced or unbounded.
    fn max_cost(&self, _seq: &Prepared) -> Option<f64> {
        None
    }
    /// Series of its own for `/metrics` (a model served elsewhere: its replicas' load, breakers,
    /// retries, errors, spend), registered by the server beside its own.
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![]
    }
    /// Its tokens, when this process runs it (log-probabilities as text, prompts given as token
    /// ids, adapters, the device): the engine's own seam.
    fn tokens(&self) -> Option<&dyn EngineApi> {
        None
    }
}

/// A model and the id requests and variants name it by.
#[derive(Clone)]
pub struct Entry {
    pub id: String,
    pub model: Arc<dyn Model>,
}

impl std::ops::Deref for Entry {
    type Target = dyn Model;
    fn deref(&self) -> &dyn Model {
        &*self.model
    }
}

/// Every model of the process, by id, the default first.
#[derive(Clone)]
pub struct Registry {
    entries: Vec<Entry>,
}

impl Registry {
    /// The models `entries` names, the default first; refused when it is empty or an id repeats.
    pub fn new(entries: Vec<Entry>) -> Result<Registry, String> {
        if entries.is_empty() {
            return Err("no model to serve".into());
        }
        for (i, e) in entries.iter().enumerate() {
            if e.id == "default" && i > 0 {
                return Err("the id 'default' names the first model".into());
            }
            if entries[..i].iter().any(|o| o.id == e.id) {
                return Err(format!("the model id '{}' is given twice", e.id));
            }
        }
        Ok(Registry { entries })
    }

    /// The engines of this process by id, the default first, as registry entries.
    pub fn local<E: EngineApi>(engines: Vec<(String, E)>) -> Result<Registry, String> {
        Registry::new(
            engines
                .into_iter()
                .map(|(id, e)| Entry {
                    id,
                    model: Arc::new(crate::Local(e)),
                })
                .collect(),
        )
    }

    /// This registry with `more` after its entries (models served elsewhere beside the engines
    /// of this process); refused when an id repeats.
    pub fn extended(self, more: Vec<Entry>) -> Result<Registry, String> {
        let mut entries = self.entries;
        entries.extend(more);
        Registry::new(entries)
    }

    /// The default model (requests that name no other, variants without `model`).
    pub fn default_entry(&self) -> &Entry {
        &self.entries[0]
    }

    /// The position of the model `id` names (`default` is the first), if served here.
    pub fn index(&self, id: &str) -> Option<usize> {
        if id == "default" {
            return Some(0);
        }
        self.entries.iter().position(|e| e.id == id)
    }

    /// The entry at `i` (see [`Registry::index`]).
    pub fn at(&self, i: usize) -> &Entry {
        &self.entries[i]
    }

    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.index(id).map(|i| &self.entries[i])
    }

    /// The model a call or a variant names (the default for none), or why there is none.
    pub fn named(&self, model: Option<&str>) -> Result<&Entry, String> {
        let Some(id) = model else {
            return Ok(self.default_entry());
        };
        self.get(id).ok_or_else(|| {
            format!(
                "'{id}' is not a model this process serves (it serves {})",
                self.ids().join(", ")
            )
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    /// Every id, the default first.
    pub fn ids(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.id.as_str()).collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Sequence slots of every model together.
    pub fn seq_slots(&self) -> usize {
        self.entries.iter().map(|e| e.capacity().seq_slots).sum()
    }

    /// The memory plans of the models this process runs (a model served elsewhere has none).
    pub fn plans(&self) -> impl Iterator<Item = &MemoryPlan> {
        self.entries.iter().filter_map(|e| e.plan())
    }
}
