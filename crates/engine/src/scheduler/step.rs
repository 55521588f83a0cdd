//! One scheduler step: reap, admit, make room, then one decode per adapter set among the
//! running sequences (llama.cpp applies one set of LoRA adapters to a context at a time), each
//! followed by its sampling (`batch.rs`).
//!
//! Invariants: a sequence is decoded only while its own adapter set is applied (the set is
//! applied right before each decode, and a batch holds only that set's sequences); every set
//! with running sequences gets a decode in every step, in the order of first appearance (the
//! base model first), so no variant's sequences wait a step for another's.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{batch, Compute, Scheduler};
use crate::adapters::AdapterSet;
use crate::request::GenerationError;

impl Scheduler {
    /// The scheduler's id for `set` (0: the base model), given once per distinct set.
    pub(super) fn intern(&mut self, set: AdapterSet) -> u32 {
        if let Some(i) = self.sets.iter().position(|s| *s == set) {
            return i as u32;
        }
        self.sets.push(set);
        (self.sets.len() - 1) as u32
    }

    /// The adapter sets of the running sequences, each once, by id.
    fn running_sets(&self) -> Vec<u32> {
        let mut sets: Vec<u32> = self.running.iter().map(|a| a.seq.adapters).collect();
        sets.sort_unstable();
        sets.dedup();
        sets
    }

    /// One iteration. Returns false when there was nothing to run.
    pub fn step<C: Compute>(&mut self, be: &mut C) -> bool {
        let t0 = Instant::now();
        self.reap_cancelled(be);
        self.admit(be);
        let t_admit = t0.elapsed();
        if self.running.is_empty() {
            self.publish();
            return false;
        }
        self.ensure_room(be);
        let (mut seqs, mut tokens, mut decodes, mut runs) = (0, 0, 0, 0);
        let mut decode_only = true;
        let mut ran = false;
        let log = tracing::enabled!(target: "abserve_engine::step", tracing::Level::DEBUG);
        for set in self.running_sets() {
            let plan = match self.decode_set(be, set) {
                Ok(plan) => plan,
                Err(r) => {
                    ran |= r;
                    continue;
                }
            };
            decodes += 1;
            seqs += plan.len();
            tokens += plan.iter().map(|p| p.n).sum::<usize>();
            decode_only &= plan.iter().all(|p| p.n == 1);
            // the step log's figures cost a sort per decode: only when it is on
            if log {
                runs += self.slot_runs(&plan);
            }
            self.after_decode(be, &plan);
        }
        if decodes == 0 {
            self.publish();
            return ran;
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        let dt = t0.elapsed();
        if decode_only {
            self.steps.observe(seqs, dt);
        }
        self.stats
            .last_step_micros
            .store(dt.as_micros() as u64, Ordering::Relaxed);
        if log {
            tracing::debug!(
                target: "abserve_engine::step",
                seqs,
                tokens,
                runs,
                decodes,
                admit_ms = t_admit.as_secs_f64() * 1e3,
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

    /// Applies adapter set `set` and decodes a batch of its running sequences; a set that
    /// cannot be applied fails those sequences, named.
    fn decode_set<C: Compute>(
        &mut self,
        be: &mut C,
        set: u32,
    ) -> Result<Vec<batch::Planned>, bool> {
        if let Err(e) = be.set_adapters(&self.sets[set as usize]) {
            let label = self.sets[set as usize].label();
            tracing::error!("applying adapters {label} failed: {e}");
            let plan: Vec<batch::Planned> = (0..self.running.len())
                .filter(|&i| self.running[i].seq.adapters == set)
                .map(|idx| batch::Planned {
                    idx,
                    n: 0,
                    first: 0,
                    logits: None,
                })
                .collect();
            let err = GenerationError::Decode(format!("applying adapters {label}: {e}"));
            self.fail_batch(be, &plan, err);
            return Err(true);
        }
        self.decode_batch(be, set)
    }

    /// Builds one batch of set `set`'s sequences and decodes it; without KV room for it, cached
    /// prefixes go first, then the newest sequence is preempted and the batch built again.
    /// `Err(ran)`: nothing decoded; `ran`: the step still did something (a batch failed and its
    /// sequences were told so).
    fn decode_batch<C: Compute>(
        &mut self,
        be: &mut C,
        set: u32,
    ) -> Result<Vec<batch::Planned>, bool> {
        loop {
            let plan = self.build_batch(be, set);
            if plan.is_empty() {
                return Err(false);
            }
            let decoded = be.decode();
            // llama.cpp applied pending stream copies at the start of that call
            self.pinned.clear();
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
    fn slot_runs(&self, plan: &[batch::Planned]) -> usize {
        let mut slots: Vec<i32> = plan.iter().map(|p| self.running[p.idx].slot).collect();
        slots.sort_unstable();
        slots.windows(2).filter(|w| w[1] != w[0] + 1).count() + 1
    }
}
