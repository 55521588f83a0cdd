//! Priority classes: live requests before an experiment's fan-out before batch work (eval, the
//! worker), and within a class vLLM's integer `priority` (lower first).
//!
//! Admission (`admission.rs`) takes the most urgent waiting request first ([`Seq::urgency`]:
//! readiness probes, then class, then `priority`; arrival and the fair window among equals).
//! When no slot is free — or, in a unified cache, no cells — for the most urgent waiting
//! request, it takes the slot of the least urgent running sequence that is strictly less urgent
//! than itself, the latest to arrive among equals (vLLM's priority scheduler preempts the same
//! way; by arrival, not admission, so a sequence just readmitted after a preemption is not the
//! next to go again). The
//! preempted sequence keeps everything it has (tokens, sampler, text, channel: it is never lost
//! and never answers twice): its computed KV is saved to the host prefix store where the store
//! takes it, and restored when it is admitted again, else recomputed.
//!
//! Starvation is bounded: a sequence preempted [`MAX_BUMPS`] times for more urgent requests is
//! not preempted for one again (it still waits in class order whenever it waits for a slot; a
//! unified cache short of memory may still preempt it, as it would any sequence). Readiness
//! probes are never preempted, and a sequence whose prefix copy has not landed yet (admitted in
//! this step) is not taken either.

use std::sync::atomic::Ordering;

use super::kv::Stored;
use super::seq::{Active, Urgency};
use super::{Compute, Scheduler};
use crate::request::Class;
use std::collections::HashSet;

/// Preemptions for more urgent requests after which a sequence keeps its slot.
pub(super) const MAX_BUMPS: u32 = 3;

impl Scheduler {
    /// Index in `running` of the least urgent sequence that `allowed` lets go, the latest to
    /// arrive among equals; never a readiness probe.
    pub(super) fn least_urgent(&self, allowed: impl Fn(&Active) -> bool) -> Option<usize> {
        (0..self.running.len())
            .filter(|&i| !self.running[i].seq.probe && allowed(&self.running[i]))
            .max_by_key(|&i| {
                (
                    self.running[i].seq.urgency(),
                    self.running[i].seq.arrived,
                    i,
                )
            })
    }

    /// Whether running sequence `a` gives its slot up to a waiting request of `urgency`: not a
    /// probe, strictly less urgent, preempted fewer than [`MAX_BUMPS`] times, and not waiting for
    /// a prefix copy.
    fn gives_way(&self, a: &Active, urgency: Urgency) -> bool {
        !a.seq.probe
            && a.seq.urgency() > urgency
            && a.seq.bumped < MAX_BUMPS
            && !self.landing.contains(&a.slot)
    }

    /// The running sequence whose slot a waiting request of `urgency` takes (see `gives_way`).
    fn victim(&self, urgency: Urgency) -> Option<usize> {
        self.least_urgent(|a| self.gives_way(a, urgency))
    }

    /// Preempts for the most urgent waiting request that could be admitted (not `deferred`, not
    /// waiting for its lane, not over its group's KV share) when a less urgent sequence runs;
    /// false when there is none to preempt.
    pub(super) fn bump_for_waiting<C: Compute>(
        &mut self,
        be: &mut C,
        deferred: &HashSet<u64>,
    ) -> bool {
        let most = self
            .waiting
            .iter()
            .filter(|s| !deferred.contains(&s.id) && !self.waits_for_lane(s) && !self.over_quota(s))
            .map(|s| s.urgency())
            .min();
        self.bump_for(be, most)
    }

    /// Preempts one sequence less urgent than `urgency` (if any); true when it did.
    pub(super) fn bump_for<C: Compute>(&mut self, be: &mut C, urgency: Option<Urgency>) -> bool {
        match urgency.and_then(|u| self.victim(u)) {
            Some(v) => {
                self.bump(be, v);
                true
            }
            None => false,
        }
    }

    /// Frees `short` slots for group `gang` by preempting less urgent sequences, when that many
    /// can go (none is preempted for a gang that would still not fit).
    pub(super) fn bump_for_gang<C: Compute>(
        &mut self,
        be: &mut C,
        gang: u64,
        short: usize,
    ) -> bool {
        let Some(urgency) = self
            .waiting
            .iter()
            .filter(|s| s.gang == Some(gang))
            .map(|s| s.urgency())
            .min()
        else {
            return false;
        };
        let can_go = self
            .running
            .iter()
            .filter(|a| self.gives_way(a, urgency))
            .count();
        if short == 0 || can_go < short {
            return false;
        }
        (0..short).all(|_| self.bump_for(be, Some(urgency)))
    }

    /// Preempts running sequence `idx` for a more urgent request: its KV is saved to the prefix
    /// store where the store takes it, and it waits again.
    fn bump<C: Compute>(&mut self, be: &mut C, idx: usize) {
        let a = &self.running[idx];
        let (id, set, slot, n_past) = (a.seq.id, a.seq.adapters, a.slot, a.n_past);
        if self.store.enabled()
            && n_past >= self.cfg.min_shared_prefix
            && self.store.best_common(set, &a.seq.tokens[..n_past]) < n_past
        {
            let tokens = a.seq.tokens[..n_past].to_vec();
            self.save_to_store(be, slot, id, set, tokens);
        }
        tracing::debug!(
            seq = id,
            class = self.running[idx].seq.class.as_str(),
            "preempted for a more urgent request"
        );
        self.running[idx].seq.bumped += 1;
        self.preempt_at(be, idx);
    }

    /// Saves the KV of `slot` (the positions of `tokens`) to the host prefix store (which the
    /// caller found on).
    pub(super) fn save_to_store<C: Compute>(
        &mut self,
        be: &mut C,
        slot: i32,
        id: u64,
        set: u32,
        tokens: Vec<i32>,
    ) {
        debug_assert!(self.store.enabled(), "saving to a prefix store that is off");
        let Some((snap, bytes)) = be.save_seq(slot) else {
            return;
        };
        self.clock += 1;
        self.store.insert(Stored {
            id,
            set,
            tokens,
            snap,
            bytes,
            last_used: self.clock,
        });
        self.stats
            .prefix_store_bytes
            .store(self.store.bytes as u64, Ordering::Relaxed);
        self.stats
            .prefix_store_entries
            .store(self.store.entries.len() as u64, Ordering::Relaxed);
    }

    /// The most urgent class of the sequences picked to decode (`pick[lane]`, as in
    /// `build_batch`) that still await their first token, when a less urgent picked sequence
    /// runs beside them: this step decodes only the sequences of that class still awaiting
    /// their first token and those of more urgent classes ([`Active::sits_out`]), so a live
    /// request's first token waits neither on a full batch of less urgent work nor on the decode
    /// rows of live requests already answering (those skip one step, keeping their slots and KV).
    pub(super) fn first_token_class(&self, pick: &[Option<u32>]) -> Option<Class> {
        let picked = |a: &&Active| pick[self.lanes.lane_of(a.slot)] == Some(a.seq.adapters);
        let urgent = self
            .running
            .iter()
            .filter(picked)
            .filter(|a| a.seq.first_token.is_none())
            .map(|a| a.seq.class)
            .min()?;
        let behind = self
            .running
            .iter()
            .filter(picked)
            .any(|a| a.seq.class > urgent);
        behind.then_some(urgent)
    }

    /// Waiting and running sequences per class, for `/metrics`.
    pub(super) fn publish_classes(&self) {
        for class in Class::ALL {
            let c = self.stats.class(class);
            let waiting = self.waiting.iter().filter(|s| s.class == class).count();
            let running = self.running.iter().filter(|a| a.seq.class == class).count();
            c.waiting.store(waiting as u64, Ordering::Relaxed);
            c.running.store(running as u64, Ordering::Relaxed);
        }
    }
}
