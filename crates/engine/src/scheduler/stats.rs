//! Live counters of the engine, written by the scheduler only and readable from any thread.
//!
//! Fields are private to the crate: the scheduler is the one writer, except the in-flight count,
//! whose one owner is the [`InFlight`] permit (taken by the engine handle before a request
//! reaches the engine thread, given back when dropped). Readers take a
//! [`StatsSnapshot`] or [`EngineStats::groups`]. The per-group table is behind a mutex that is
//! never held across a panic-prone call, and a poisoned lock is read through, so a panic on one
//! side cannot take the other down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::grammar::GrammarStats;
use crate::request::Class;

#[derive(Debug, Default)]
pub struct EngineStats {
    pub(crate) kv_cells_total: AtomicU64,
    pub(crate) kv_cells_used: AtomicU64,
    pub(crate) running: AtomicU64,
    pub(crate) waiting: AtomicU64,
    pub(crate) preemptions: AtomicU64,
    pub(crate) cancellations: AtomicU64,
    /// Prompt tokens of every request submitted.
    pub(crate) prompt_tokens: AtomicU64,
    /// Prompt positions llama.cpp really computed (a recompute after preemption counts again).
    pub(crate) prompt_tokens_computed: AtomicU64,
    pub(crate) generated_tokens: AtomicU64,
    /// Prompt tokens whose KV came from another sequence or a cached prefix.
    pub(crate) shared_prompt_tokens: AtomicU64,
    /// Whole-stream copies between slots (split KV streams only).
    pub(crate) prefix_copies: AtomicU64,
    /// Times a context (a lane) was given another adapter set than it had: each makes
    /// llama.cpp reserve that context's compute graphs again.
    pub(crate) adapter_set_changes: AtomicU64,
    pub(crate) steps: AtomicU64,
    pub(crate) last_step_micros: AtomicU64,
    pub(crate) completed: AtomicU64,
    /// Largest number of cells ever in use by running sequences.
    pub(crate) kv_cells_peak: AtomicU64,
    /// Cells held only by cached prefixes of finished sequences (free on demand).
    pub(crate) kv_cells_cached: AtomicU64,
    /// Host-memory prefix store: bytes and entries held, restores made.
    pub(crate) prefix_store_bytes: AtomicU64,
    pub(crate) prefix_store_entries: AtomicU64,
    pub(crate) prefix_restores: AtomicU64,
    /// Waiting requests held back by the inter-token-latency target (last step).
    pub(crate) itl_held: AtomicU64,
    /// Impossible states met (each failed one request) and panics caught (each failed all).
    pub(crate) faults: AtomicU64,
    /// Grammars compiled and refused (shared with the grammar compiler, `Grammars`).
    pub(crate) grammar: Arc<GrammarStats>,
    /// Token masks computed for constrained sequences, and the microseconds they took.
    pub(crate) grammar_masks: AtomicU64,
    pub(crate) grammar_mask_micros: AtomicU64,
    /// Tokens generated under a grammar, and of those the ones the grammar forced (fast-forward).
    pub(crate) constrained_tokens: AtomicU64,
    pub(crate) forced_tokens: AtomicU64,
    /// Draft tokens verified (speculative decoding), and of those the ones accepted.
    pub(crate) draft_tokens: AtomicU64,
    pub(crate) draft_accepted: AtomicU64,
    /// Of those, the ones the draft model proposed (`--draft-model`), and of those the accepted.
    pub(crate) draft_model_tokens: AtomicU64,
    pub(crate) draft_model_accepted: AtomicU64,
    /// Constrained sequences running now (each holds one matcher).
    pub(crate) constrained_running: AtomicU64,
    /// Bytes of those matchers' lexer tables (`Constraint::bytes`).
    pub(crate) matcher_bytes: AtomicU64,
    /// Per priority class, in [`Class::ALL`] order (requests in flight are counted here alone:
    /// the total is their sum).
    pub(crate) classes: [PerClass; 3],
    /// Cells held per group (experiment): (now, peak).
    groups: Mutex<HashMap<String, (u64, u64)>>,
    /// Finished requests per adapter set (its label), at most [`MAX_SET_LABELS`] sets.
    sets: Mutex<HashMap<String, SetCounts>>,
}

/// The live counters of one priority class.
#[derive(Debug, Default)]
pub(crate) struct PerClass {
    pub(crate) waiting: AtomicU64,
    pub(crate) running: AtomicU64,
    /// Its sequences preempted (for a more urgent class or, in a unified cache, for memory).
    pub(crate) preemptions: AtomicU64,
    /// Its requests submitted and not yet finished (queued in the channel, waiting or
    /// running): counted by [`InFlight`] permits alone.
    inflight: AtomicU64,
}

/// One priority class's counters at one moment.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, PartialEq, Eq)]
pub struct ClassCounts {
    pub waiting: u64,
    pub running: u64,
    pub preemptions: u64,
    pub inflight: u64,
}

/// Sets counted by name; the rest are counted as `other` (a client chooses scales, so the
/// labels must be bounded).
const MAX_SET_LABELS: usize = 64;

/// What the requests that ran under one adapter set did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SetCounts {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
}

impl EngineStats {
    /// The running sequences' grammar matchers: how many, and their lexer tables' bytes.
    pub(crate) fn matchers<'a>(
        &self,
        running: impl Iterator<Item = &'a crate::grammar::Constraint>,
    ) {
        let (count, bytes) = running.fold((0, 0), |(n, b), c| (n + 1, b + c.bytes()));
        self.constrained_running.store(count, Ordering::Relaxed);
        self.matcher_bytes.store(bytes, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            kv_cells_total: l(&self.kv_cells_total),
            kv_cells_used: l(&self.kv_cells_used),
            kv_cells_peak: l(&self.kv_cells_peak),
            kv_cells_cached: l(&self.kv_cells_cached),
            running: l(&self.running),
            waiting: l(&self.waiting),
            preemptions: l(&self.preemptions),
            cancellations: l(&self.cancellations),
            prompt_tokens: l(&self.prompt_tokens),
            prompt_tokens_computed: l(&self.prompt_tokens_computed),
            generated_tokens: l(&self.generated_tokens),
            shared_prompt_tokens: l(&self.shared_prompt_tokens),
            prefix_copies: l(&self.prefix_copies),
            adapter_set_changes: l(&self.adapter_set_changes),
            steps: l(&self.steps),
            completed: l(&self.completed),
            inflight: self.classes.iter().map(|c| l(&c.inflight)).sum(),
            itl_held: l(&self.itl_held),
            faults: l(&self.faults),
            prefix_store_bytes: l(&self.prefix_store_bytes),
            prefix_store_entries: l(&self.prefix_store_entries),
            prefix_restores: l(&self.prefix_restores),
            grammar_compiles: l(&self.grammar.compiles),
            grammar_compile_micros: l(&self.grammar.compile_micros),
            grammar_rejections: l(&self.grammar.rejections),
            grammar_masks: l(&self.grammar_masks),
            grammar_mask_micros: l(&self.grammar_mask_micros),
            constrained_tokens: l(&self.constrained_tokens),
            forced_tokens: l(&self.forced_tokens),
            draft_tokens: l(&self.draft_tokens),
            draft_accepted: l(&self.draft_accepted),
            draft_model_tokens: l(&self.draft_model_tokens),
            draft_model_accepted: l(&self.draft_model_accepted),
            constrained_running: l(&self.constrained_running),
            matcher_bytes: l(&self.matcher_bytes),
            classes: self.classes.each_ref().map(|c| ClassCounts {
                waiting: l(&c.waiting),
                running: l(&c.running),
                preemptions: l(&c.preemptions),
                inflight: l(&c.inflight),
            }),
        }
    }

    /// The counters of `class`.
    pub(crate) fn class(&self, class: Class) -> &PerClass {
        &self.classes[class.index()]
    }

    /// Cells held per group (experiment) now and at peak, sorted by name.
    pub fn groups(&self) -> Vec<(String, u64, u64)> {
        let mut v: Vec<_> = self
            .lock_groups()
            .iter()
            .map(|(k, &(now, peak))| (k.clone(), now, peak))
            .collect();
        v.sort();
        v
    }

    pub(crate) fn lock_groups(&self) -> MutexGuard<'_, HashMap<String, (u64, u64)>> {
        self.groups
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A request that ran under the adapter set `label` finished.
    pub(crate) fn count_set(&self, label: String, prompt: usize, generated: usize) {
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        let key = if sets.len() < MAX_SET_LABELS || sets.contains_key(&label) {
            label
        } else {
            "other".to_string()
        };
        let c = sets.entry(key).or_default();
        c.requests += 1;
        c.prompt_tokens += prompt as u64;
        c.generated_tokens += generated as u64;
    }

    /// Finished requests per adapter set (`base` for none), sorted by label.
    pub fn adapter_sets(&self) -> Vec<(String, SetCounts)> {
        let sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = sets.iter().map(|(k, c)| (k.clone(), *c)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The counters the grammar compiler writes.
    pub fn grammar_stats(&self) -> Arc<GrammarStats> {
        self.grammar.clone()
    }

    pub(crate) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub kv_cells_total: u64,
    pub kv_cells_used: u64,
    pub kv_cells_peak: u64,
    pub kv_cells_cached: u64,
    pub running: u64,
    pub waiting: u64,
    pub preemptions: u64,
    pub cancellations: u64,
    pub prompt_tokens: u64,
    pub prompt_tokens_computed: u64,
    pub generated_tokens: u64,
    pub shared_prompt_tokens: u64,
    pub prefix_copies: u64,
    pub adapter_set_changes: u64,
    pub steps: u64,
    pub completed: u64,
    pub inflight: u64,
    pub itl_held: u64,
    pub faults: u64,
    pub prefix_store_bytes: u64,
    pub prefix_store_entries: u64,
    pub prefix_restores: u64,
    pub grammar_compiles: u64,
    pub grammar_compile_micros: u64,
    pub grammar_rejections: u64,
    pub grammar_masks: u64,
    pub grammar_mask_micros: u64,
    pub constrained_tokens: u64,
    pub forced_tokens: u64,
    /// Draft tokens verified by speculative decoding, and of those the ones accepted.
    pub draft_tokens: u64,
    pub draft_accepted: u64,
    /// Of those, the ones the draft model proposed, and of those the accepted.
    pub draft_model_tokens: u64,
    pub draft_model_accepted: u64,
    pub constrained_running: u64,
    pub matcher_bytes: u64,
    /// Per priority class, in [`Class::ALL`] order.
    pub classes: [ClassCounts; 3],
}

/// One request's place among the engine's slots + queue: counted in its class's `inflight`
/// (so that the queue bound can be applied per class) from the moment the handle takes it
/// ([`InFlight::take`]) until the permit is dropped — with the sequence that holds it (finished,
/// failed, cancelled, aborted), or with the command that never reached the engine thread. The
/// count has this one owner, so no path can forget a place or give it back twice. The default
/// permit holds no place.
#[derive(Default)]
pub(crate) struct InFlight(Option<(Arc<EngineStats>, Class)>);

impl InFlight {
    /// `n` places of `class` at once, with the places of `class` and the more urgent classes
    /// before them (the caller decides whether they fit; a refused request drops its permits).
    /// Less urgent work is not counted: a more urgent request takes its slot when none is free.
    pub(crate) fn take(stats: &Arc<EngineStats>, n: usize, class: Class) -> (usize, Vec<InFlight>) {
        stats
            .class(class)
            .inflight
            .fetch_add(n as u64, Ordering::SeqCst);
        let before: u64 = Class::ALL
            .iter()
            .filter(|&&c| c <= class)
            .map(|&c| stats.class(c).inflight.load(Ordering::SeqCst))
            .sum();
        (
            before as usize - n,
            (0..n)
                .map(|_| InFlight(Some((stats.clone(), class))))
                .collect(),
        )
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some((stats, class)) = self.0.take() {
            stats.class(class).inflight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
