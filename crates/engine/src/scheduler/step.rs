//! One scheduler step: reap, admit, make room, then decode the running sequences of the adapter
//! set whose turn it is (llama.cpp applies one set of LoRA adapters to a context at a time),
//! followed by their sampling (`batch.rs`).
//!
//! Turns: applying another set makes llama.cpp reserve its compute graphs again (a new backend
//! scheduler and worst-case graphs), which costs more than a decode of a few sequences. So with
//! sequences of several sets running, one set keeps the context for `adapter_turn` steps, then
//! the next set (by id, wrapping) with running sequences takes it: every set gets the same
//! number of steps in a round, and none waits more than `adapter_turn` × (sets − 1) steps.
//! With one set running there are no turns (the base model alone is unaffected), and
//! `adapter_turn = 0` decodes every set in every step.
//!
//! Invariants: a sequence is decoded only while its own adapter set is applied (the set is
//! applied right before each decode, and a batch holds only that set's sequences); a step in
//! which the set whose turn it is has nothing to decode passes the turn on at once, so a step
//! with running sequences always decodes something when anything can be decoded.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Compute, Planned, Scheduler};
use crate::adapters::AdapterSet;
use crate::request::GenerationError;

/// Size of the adapter-set table from which unused ids are given again (`Scheduler::intern`).
const REUSE_SETS_FROM: usize = 64;

impl Scheduler {
    /// The scheduler's id for `set` (0: the base model). Ids of sets that nothing refers to any
    /// more (no sequence, cached prefix or stored prefix) are given again once the table holds
    /// `REUSE_SETS_FROM` sets, so that clients sending ever new scales cannot grow it.
    pub(super) fn intern(&mut self, set: AdapterSet) -> u32 {
        if let Some(i) = self.sets.iter().position(|s| *s == set) {
            return i as u32;
        }
        if self.sets.len() >= REUSE_SETS_FROM {
            if let Some(i) = (1..self.sets.len() as u32).find(|&i| !self.set_in_use(i)) {
                self.sets[i as usize] = set;
                return i;
            }
        }
        self.sets.push(set);
        (self.sets.len() - 1) as u32
    }

    /// Whether a sequence (waiting or running), a cached prefix or a stored prefix was made
    /// under set `id`.
    fn set_in_use(&self, id: u32) -> bool {
        self.waiting.iter().any(|s| s.adapters == id)
            || self.running.iter().any(|a| a.seq.adapters == id)
            || self.cache.iter().any(|c| c.set == id)
            || self.store.entries.iter().any(|e| e.set == id)
    }

    /// The adapter sets of the running sequences, each once, by id.
    fn running_sets(&self) -> Vec<u32> {
        let mut sets: Vec<u32> = self.running.iter().map(|a| a.seq.adapters).collect();
        sets.sort_unstable();
        sets.dedup();
        sets
    }

    /// The sets to decode this step, in order: all of them without turns; with turns, the set
    /// whose turn it is first, then the others in rotation (tried only while none decoded).
    fn sets_in_turn(&mut self) -> (Vec<u32>, bool) {
        let sets = self.running_sets();
        if sets.len() <= 1 || self.cfg.adapter_turn == 0 {
            return (sets, false);
        }
        let first = next_in_turn(&mut self.turn[0], &sets, self.cfg.adapter_turn);
        let at = sets.iter().position(|&s| s == first).unwrap_or(0);
        (
            sets[at..].iter().chain(&sets[..at]).copied().collect(),
            true,
        )
    }

    /// One iteration. Returns false when there was nothing to run.
    pub fn step<C: Compute>(&mut self, be: &mut C) -> bool {
        let t0 = Instant::now();
        let generated = self.stats.generated_tokens.load(Ordering::Relaxed);
        let drafted = self.draft_counters();
        self.reap_cancelled(be);
        self.admit(be);
        let t_admit = t0.elapsed();
        if self.running.is_empty() {
            self.publish();
            return false;
        }
        self.ensure_room(be);
        let log = tracing::enabled!(target: "abserve_engine::step", tracing::Level::DEBUG);
        let mut t = Tally::default();
        if self.lanes.count() > 1 {
            let at = Instant::now();
            let decoded = self.decode_lanes(be);
            t.decode += at.elapsed();
            match decoded {
                Ok(plan) => self.count_decode(be, &plan, &mut t, log),
                Err(r) => t.ran |= r,
            }
        } else {
            self.decode_sets(be, &mut t, log);
        }
        let Tally {
            seqs,
            tokens,
            decodes,
            runs,
            prefill,
            ran,
            decode,
            drafts,
        } = t;
        if decodes == 0 {
            self.publish();
            return ran;
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        let dt = t0.elapsed();
        self.drafts_since(drafted);
        if !prefill {
            if drafts == 0 {
                self.steps.observe(seqs, dt);
            }
            self.rows.observe(tokens, dt);
            let emitted = self.stats.generated_tokens.load(Ordering::Relaxed) - generated;
            self.spec.observe(seqs, drafts > 0, emitted as usize, dt);
        }
        self.stats
            .last_step_micros
            .store(dt.as_micros() as u64, Ordering::Relaxed);
        if log {
            tracing::debug!(
                target: "abserve_engine::step",
                seqs,
                tokens,
                drafts,
                runs,
                decodes,
                admit_ms = t_admit.as_secs_f64() * 1e3,
                decode_ms = decode.as_secs_f64() * 1e3,
                step_ms = dt.as_secs_f64() * 1e3,
                "step"
            );
        }
        if let Some(obs) = &self.observer {
            obs(dt);
        }
        self.publish();
        true
    }

    /// One lane: the running sets' batches in this step's order (with turns, only the first
    /// that decodes something).
    fn decode_sets<C: Compute>(&mut self, be: &mut C, t: &mut Tally, log: bool) {
        let (sets, turns) = self.sets_in_turn();
        for set in sets {
            if turns && t.decodes > 0 {
                break;
            }
            let at = Instant::now();
            let decoded = self.decode_set(be, set);
            t.decode += at.elapsed();
            let plan = match decoded {
                Ok(plan) => plan,
                Err(r) => {
                    t.ran |= r;
                    // its turn passes to the next set with something to decode
                    if turns {
                        self.turn[0] = (set, 0);
                    }
                    continue;
                }
            };
            if turns && self.turn[0].0 != set {
                self.turn[0] = (set, self.cfg.adapter_turn - 1);
            }
            self.count_decode(be, &plan, t, log);
        }
    }

    /// Counts a decoded batch into the step's tally, then samples and retires (`batch.rs`).
    fn count_decode<C: Compute>(&mut self, be: &mut C, plan: &[Planned], t: &mut Tally, log: bool) {
        t.decodes += 1;
        t.seqs += plan.len();
        t.tokens += plan.iter().map(|p| p.n).sum::<usize>();
        t.drafts += plan.iter().map(|p| p.draft).sum::<usize>();
        t.prefill |= plan.iter().any(|p| p.n - p.draft != 1);
        // the step log's figures cost a sort per decode: only when it is on
        if log {
            t.runs += self.slot_runs(plan);
        }
        self.after_decode(be, plan);
    }

    /// Applies adapter set `set` and decodes a batch of its running sequences (one lane).
    fn decode_set<C: Compute>(&mut self, be: &mut C, set: u32) -> Result<Vec<Planned>, bool> {
        if !self.apply_set(be, 0, set) {
            return Err(true);
        }
        self.decode_batch(be, &[Some(set)])
    }

    /// Applies set `set` to lane `lane`; a set that cannot be applied fails that lane's
    /// sequences of it, named (false).
    pub(super) fn apply_set<C: Compute>(&mut self, be: &mut C, lane: usize, set: u32) -> bool {
        let Err(e) = be.set_adapters(lane, &self.sets[set as usize]) else {
            if self.on_lane[lane] != self.sets[set as usize] {
                self.on_lane[lane] = self.sets[set as usize].clone();
                self.stats
                    .adapter_set_changes
                    .fetch_add(1, Ordering::Relaxed);
            }
            return true;
        };
        let label = self.sets[set as usize].label();
        tracing::error!("applying adapters {label} failed: {e}");
        let plan: Vec<Planned> = (0..self.running.len())
            .filter(|&i| {
                let a = &self.running[i];
                a.seq.adapters == set && self.lanes.lane_of(a.slot) == lane
            })
            .map(|idx| Planned {
                idx,
                n: 0,
                first: 0,
                logits: None,
                draft: 0,
            })
            .collect();
        let err = GenerationError::Decode(format!("applying adapters {label}: {e}"));
        self.fail_batch(be, &plan, err);
        false
    }

    /// Builds one batch of each lane's picked set's sequences (`pick[lane]`) and decodes it;
    /// without KV room for it, cached prefixes go first, then the newest sequence is preempted
    /// and the batch built again. `Err(ran)`: nothing decoded; `ran`: the step still did
    /// something (a batch failed and its sequences were told so).
    pub(super) fn decode_batch<C: Compute>(
        &mut self,
        be: &mut C,
        pick: &[Option<u32>],
    ) -> Result<Vec<Planned>, bool> {
        loop {
            let plan = self.build_batch(be, pick);
            if plan.is_empty() {
                return Err(false);
            }
            let decoded = be.decode();
            // llama.cpp applied pending stream copies at the start of that call
            self.pinned.clear();
            self.landing.clear();
            match decoded {
                Ok(true) => return Ok(plan),
                Ok(false) if self.evict_lru(be, None) => continue,
                Ok(false) if !self.cfg.admission_control => {
                    // what a server without a memory plan does: the batch fails
                    self.fail_batch(be, &plan, GenerationError::OutOfMemory);
                    return Err(true);
                }
                Ok(false) if self.running.len() <= 1 => {
                    self.fail_batch(be, &plan, GenerationError::NoSlot);
                    return Err(true);
                }
                Ok(false) => {
                    tracing::debug!("no KV slot for the batch; preempting");
                    self.preempt_newest(be);
                }
                Err(e) => {
                    tracing::error!("llama_decode failed: {e}");
                    self.fail_batch(be, &plan, GenerationError::Decode(e.to_string()));
                    return Err(true);
                }
            }
        }
    }

    /// How many runs of consecutive slots a batch's sequences form (the step log's `runs`).
    fn slot_runs(&self, plan: &[Planned]) -> usize {
        let mut slots: Vec<i32> = plan.iter().map(|p| self.running[p.idx].slot).collect();
        slots.sort_unstable();
        slots.windows(2).filter(|w| w[1] != w[0] + 1).count() + 1
    }
}

/// What a step decoded, for its statistics and its log line.
#[derive(Default)]
struct Tally {
    seqs: usize,
    tokens: usize,
    decodes: usize,
    /// Runs of consecutive slots (counted only when the step log is on).
    runs: usize,
    /// A batch held more than one token of a sequence besides its drafts (not a decode-only
    /// step).
    prefill: bool,
    /// Draft tokens in the step's batches (`speculate.rs`).
    drafts: usize,
    /// Nothing decoded, but batches failed (their sequences were told).
    ran: bool,
    /// Time in building batches, applying adapter sets and llama_decode (the rest of a step is
    /// admission, sampling and bookkeeping).
    decode: std::time::Duration,
}

/// The set that decodes next on a context whose running sequences are of `sets` (sorted,
/// deduplicated, not empty): the set whose turn it is keeps the context for `adapter_turn`
/// steps (`turn`: it and the steps left), then the next set by id, wrapping, takes it.
pub(super) fn next_in_turn(turn: &mut (u32, usize), sets: &[u32], adapter_turn: usize) -> u32 {
    let (current, left) = *turn;
    if left > 0 && sets.contains(&current) {
        turn.1 -= 1;
        return current;
    }
    let next = sets
        .iter()
        .copied()
        .find(|&s| s > current)
        .unwrap_or(sets[0]);
    *turn = (next, adapter_turn.max(1) - 1);
    next
}
