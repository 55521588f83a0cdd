//! A sequence's life: [`Seq`] is a request with everything that survives a preemption (its
//! tokens so far, sampler state, text stream, channel, timings); [`Active`] is a `Seq` that holds
//! a slot and KV cells. The state owns the slot: a waiting `Seq` has none, an `Active` always has
//! one, so no code path can decode a sequence without a slot or leak one on preemption.
//!
//! waiting (`Seq`) → prefilling (`Active`, more than one token to compute) → decoding (`Active`,
//! one token to compute) → finished (a `Completion`; its KV may stay as a cached prefix) — or
//! back to waiting when preempted (memory, in a unified cache; or a more urgent class, `classes.rs`)
//! and restored from the prefix store or recomputed on readmission.

use std::time::Instant;

use super::speculate::Acceptance;
use super::InFlight;
use crate::adapters::AdapterLease;
use crate::grammar::Constraint;
use crate::request::{Class, EventSender};
use crate::sampler::Sampler;
use crate::text::TextStream;

pub(super) struct Seq {
    pub id: u64,
    /// Prompt followed by every generated token.
    pub tokens: Vec<i32>,
    pub n_prompt: usize,
    /// Hard stop: min(prompt + max_tokens, context).
    pub limit: usize,
    pub sampler: Sampler,
    pub text: TextStream,
    pub tx: EventSender,
    pub group: Option<String>,
    pub kv_share: Option<f64>,
    /// A readiness probe: admitted first, never preempted.
    pub probe: bool,
    pub class: Class,
    /// Order within the class (vLLM's `priority`: lower first).
    pub priority: i32,
    pub arrived: Instant,
    pub admitted: Option<Instant>,
    pub first_token: Option<Instant>,
    pub preemptions: u32,
    /// Of those, the times a more urgent request took its slot (`classes.rs`): at
    /// `classes::MAX_BUMPS` it is not preempted for one again.
    pub bumped: u32,
    /// Prompt tokens whose KV came from elsewhere at first admission.
    pub shared_prompt_tokens: usize,
    /// Members of one group submission (`Engine::submit_group`: a fan-out, `n` choices, a
    /// multi-prompt completion) share this id: they are admitted in one step, or all wait.
    pub gang: Option<u64>,
    /// The grammar the answer must match; survives preemption with the tokens it has seen.
    pub constraint: Option<Constraint>,
    /// Trailing tokens of `tokens` not yet sent: forced tokens waiting for the decode of the
    /// position before them (see `sample.rs`).
    pub unemitted: usize,
    /// Tokens the grammar forced so far.
    pub forced: usize,
    /// The adapter set the sequence runs under (the scheduler's id for it; 0: the base model).
    pub adapters: u32,
    /// Keeps the set's adapters loaded until the sequence is dropped (`adapters/budget.rs`):
    /// released by [`Seq::ended`].
    pub lease: AdapterLease,
    /// The request's place among slots + queue, given back by [`Seq::ended`] or when the
    /// sequence is dropped.
    pub permit: InFlight,
    /// How often its drafts are accepted (`speculate.rs`).
    pub acceptance: Acceptance,
}

impl Seq {
    /// The sequence once it has ended, before its caller hears so: its adapters and its place
    /// are released first, so a caller that sends its next request at once finds them free.
    pub fn ended(mut self) -> Self {
        self.lease = AdapterLease::default();
        self.permit = InFlight::default();
        self
    }
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.n_prompt
    }
    /// Trailing tokens that must be computed by this sequence itself, never taken from a shared
    /// prefix: the last (its own logits) and the forced tokens not yet emitted (their logits).
    pub fn own_tail(&self) -> usize {
        1 + self.unemitted
    }
    /// Its place in the admission order, most urgent least: probes, then class, then
    /// `priority` (arrival breaks ties: `admission.rs`).
    pub fn urgency(&self) -> Urgency {
        (!self.probe, self.class, self.priority)
    }
    pub fn uses_prompt_cache(&self) -> bool {
        self.sampler.params().uses_prompt_cache()
    }
}

/// A sequence's place in the admission order: smaller goes first ([`Seq::urgency`]).
pub(super) type Urgency = (bool, Class, i32);

/// Where a running sequence is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// More than one position left to compute before the next logits.
    Prefilling,
    /// Exactly one: the last sampled token.
    Decoding,
}

/// A sequence that holds a slot (llama.cpp sequence id) and the cells of positions [0, n_past).
pub(super) struct Active {
    pub seq: Seq,
    pub slot: i32,
    /// Positions already in the KV cache.
    pub n_past: usize,
    /// Cell id of each position in [0, n_past) (scheduler accounting, see `kv.rs`).
    pub cells: Vec<u32>,
    /// Draft tokens to verify after the pending one in this step (`speculate.rs`); empty
    /// outside a step that drafts for it.
    pub draft: Vec<i32>,
}

impl Active {
    /// Whether it skips a step that computes a first token of class `floor`
    /// (`Scheduler::first_token_class`): a less urgent sequence, or one of that class that has
    /// its first token already.
    pub fn sits_out(&self, floor: Option<Class>) -> bool {
        floor.is_some_and(|c| {
            self.seq.class > c || (self.seq.class == c && self.seq.first_token.is_some())
        })
    }
    pub fn pending(&self) -> usize {
        self.seq.tokens.len() - self.n_past
    }
    pub fn phase(&self) -> Phase {
        if self.pending() == 1 {
            Phase::Decoding
        } else {
            Phase::Prefilling
        }
    }
}
