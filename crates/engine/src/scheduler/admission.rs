//! Admission: which waiting request goes next, where its prompt's KV comes from, and whether
//! memory, its group's KV share and the inter-token-latency target let it in.
//!
//! Prefix sources, longest first (ties: cached slot, then the host-memory store, then a running
//! sequence): a cached slot is taken in place; a stored prefix is restored into a free slot; a
//! running sequence's stream is copied.
//!
//! Order: readiness probes first; then the most urgent class and `priority` (`classes.rs`:
//! with no slot free, such a request preempts a less urgent one); then, among requests that
//! arrived within `fair_window` of the oldest eligible one, a seeded random pick (the variants
//! of a fan-out do not go in loop order).
//! A request whose longest reusable prefix is still being computed by a running sequence is
//! deferred until that sequence has computed it (it then copies it instead of computing it
//! again) — and keeps its claim on a slot meanwhile, so the variants whose prefixes are ready
//! first do not take every slot; a request over its group's KV share waits for the group to
//! shrink; with adapter lanes, a request whose set runs in a lane waits for a slot of such a
//! lane rather than add its set to another lane's turns (`lane_steps.rs`), claiming no slot.

use std::collections::HashSet;
use std::time::Instant;

use rand::Rng;

use super::kv::common_prefix;
use super::seq::{Active, Seq};
use super::stats::EngineStats;
use super::{Compute, InFlight, Scheduler};
use crate::request::{admitted_together, Event, EventSender, Request};
use std::sync::atomic::Ordering;

/// Where a prompt's prefix can come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// A finished sequence's cached slot (taken in place).
    Cached { id: u64 },
    /// The host-memory prefix store (restored into a free slot).
    Stored { id: u64 },
    /// A running sequence (copied, or shared in a unified cache); `ready` once it has computed
    /// the positions.
    Running { id: u64, ready: bool },
}

/// Whether a candidate's cells can be had ([`Scheduler::cells_for`]).
enum Room {
    Fits,
    /// Something gave way: look again.
    Retry,
    /// Not now: admission stops for this step.
    Wait,
}

impl Scheduler {
    /// Queues requests that are admitted together or not at all (see `admission.rs`). A group
    /// larger than the slots can never run at once: its members queue as plain requests (they
    /// were accepted whole, so every one runs, in order, as slots free).
    pub(crate) fn enqueue_gang(&mut self, reqs: Vec<(Request, EventSender, InFlight)>) {
        let together = reqs.len() > 1 && admitted_together(reqs.len(), self.cfg.seq_slots);
        let gang = together.then(|| {
            self.gangs += 1;
            self.gangs
        });
        for (req, tx, permit) in reqs {
            self.enqueue(req, tx, permit);
            if let Some(s) = self.waiting.last_mut() {
                s.gang = gang;
            }
        }
    }

    /// Index in `waiting` of the next request to admit: probes first, then among the eligible
    /// ones of the most urgent class and `priority` (`classes.rs`), a random pick among those
    /// that arrived within `fair_window` of the oldest.
    fn next_candidate(&mut self, deferred: &HashSet<u64>) -> Option<usize> {
        if let Some(i) = self.waiting.iter().position(|s| s.probe) {
            return Some(i);
        }
        let eligible: Vec<usize> = (0..self.waiting.len())
            .filter(|&i| {
                !deferred.contains(&self.waiting[i].id) && !self.over_quota(&self.waiting[i])
            })
            .collect();
        let most = eligible.iter().map(|&i| self.waiting[i].urgency()).min()?;
        let eligible: Vec<usize> = eligible
            .into_iter()
            .filter(|&i| self.waiting[i].urgency() == most)
            .collect();
        let oldest = eligible.iter().map(|&i| self.waiting[i].arrived).min()?;
        let window: Vec<usize> = eligible
            .into_iter()
            .filter(|&i| self.waiting[i].arrived <= oldest + self.cfg.fair_window)
            .collect();
        Some(window[self.rng.gen_range(0..window.len())])
    }

    /// Cells a group's running sequences hold or will fill.
    pub(super) fn group_demand(&self, group: &str) -> usize {
        self.running
            .iter()
            .filter(|r| r.seq.group.as_deref() == Some(group))
            .map(|r| r.cells.len() + r.pending())
            .sum()
    }

    /// Would admitting `s` take its group beyond its KV share? A group may always run one.
    pub(super) fn over_quota(&self, s: &Seq) -> bool {
        let (Some(share), Some(group)) = (s.kv_share, s.group.as_deref()) else {
            return false;
        };
        if !self
            .running
            .iter()
            .any(|r| r.seq.group.as_deref() == Some(group))
        {
            return false;
        }
        self.group_demand(group) + s.tokens.len() > self.quota_cells(share)
    }

    /// Cells a KV share allows.
    pub(super) fn quota_cells(&self, share: f64) -> usize {
        (share * self.cfg.kv_cells as f64) as usize
    }

    /// Longest prefix of `tokens` that a cached slot or a running sequence holds or will hold
    /// (at least `min_shared_prefix`, and never the last `own_tail` tokens: the last token is
    /// always computed so the request gets its own logits). On equal length a cached slot wins
    /// (taken in place, no copy), then the host store, then a running sequence (copied).
    pub(super) fn find_source(
        &self,
        tokens: &[i32],
        set: u32,
        own_tail: usize,
        use_cache: bool,
    ) -> Option<(Source, usize)> {
        if self.cfg.min_shared_prefix == usize::MAX || tokens.len() <= own_tail {
            return None;
        }
        let usable = |common: usize| {
            let l = common.min(tokens.len() - own_tail);
            (l >= self.cfg.min_shared_prefix).then_some(l)
        };
        // holders in tie-break order (a later one must be strictly longer to win); a running
        // holder is ready once it has computed the common positions
        let cached = self
            .cache
            .iter()
            .filter(|c| use_cache && c.set == set)
            .map(|c| (Source::Cached { id: c.id }, &c.tokens, None));
        let stored = self
            .store
            .entries
            .iter()
            .filter(|e| use_cache && e.set == set)
            .map(|e| (Source::Stored { id: e.id }, &e.tokens, None));
        // KV is reused only under the adapter set that computed it
        let running = self
            .running
            .iter()
            .filter(|r| r.seq.adapters == set)
            .map(|r| {
                (
                    Source::Running {
                        id: r.seq.id,
                        ready: false,
                    },
                    &r.seq.tokens,
                    Some(r.n_past),
                )
            });
        let mut best: Option<(Source, usize)> = None;
        for (mut source, held, n_past) in cached.chain(stored).chain(running) {
            let Some(l) = usable(common_prefix(held, tokens)) else {
                continue;
            };
            if best.is_some_and(|(_, b)| l <= b) {
                continue;
            }
            if let (Source::Running { ready, .. }, Some(n)) = (&mut source, n_past) {
                *ready = n >= l;
            }
            best = Some((source, l));
        }
        best
    }

    pub(super) fn admit<C: Compute>(&mut self, be: &mut C) {
        let mut deferred = HashSet::new();
        let mut lane_waits = 0; // of `deferred`: those waiting for their set's lane (no claim)
        let mut itl_held = 0;
        while !self.waiting.is_empty() {
            // a deferred request keeps its claim on a slot: later requests of a variant whose
            // prefix happens to be ready first must not take every slot (fairness)
            if self.slots.len() + self.cache.len() <= deferred.len() - lane_waits {
                // no slot for anyone: a more urgent request takes a less urgent one's
                if self.bump_for_waiting(be, &deferred) {
                    continue;
                }
                break;
            }
            // None: every waiting request is deferred or belongs to a group at its KV quota
            let Some(i) = self.next_candidate(&deferred) else {
                break;
            };
            if let Some(gang) = self.waiting[i].gang {
                if let Some(target) = self.cfg.max_itl {
                    if !self.steps.allows_one_more(self.running.len(), target) {
                        itl_held = self.waiting.len();
                        break;
                    }
                }
                if self.admit_gang(be, gang, deferred.len()) {
                    continue;
                }
                let short = self.gang_shortfall(gang, deferred.len());
                if self.bump_for_gang(be, gang, short) {
                    continue;
                }
                // the gang waits whole, and nothing behind it takes the slots it waits for
                break;
            }
            let cand = &self.waiting[i];
            if self.waits_for_lane(cand) {
                lane_waits += usize::from(deferred.insert(cand.id));
                continue;
            }
            let source = if cand.uses_prompt_cache() || cand.preemptions > 0 {
                // a preempted sequence may take back what it computed before from anywhere
                self.find_source(&cand.tokens, cand.adapters, cand.own_tail(), true)
            } else {
                // no cache: the prompt is computed whole (bit-identical logits for a seed)
                None
            };
            if let Some((Source::Running { ready: false, .. }, _)) = source {
                if !cand.probe {
                    // another running sequence is computing this prefix: take it when it is done
                    deferred.insert(cand.id);
                    continue;
                }
            }
            if let (Some(target), false) = (self.cfg.max_itl, cand.probe) {
                if !self.steps.allows_one_more(self.running.len(), target) {
                    itl_held = self.waiting.len();
                    break;
                }
            }
            match self.cells_for(be, i, source) {
                Room::Fits => {}
                Room::Retry => continue,
                Room::Wait => break,
            }
            let s = self.waiting.swap_remove(i);
            let Some(a) = self.place(be, s, source) else {
                break;
            };
            self.start(a);
        }
        self.stats
            .itl_held
            .store(itl_held as u64, Ordering::Relaxed);
    }

    /// Whether waiting request `i`, given `source`'s prefix, fits the unified cache's cells now
    /// (split streams: always): cached prefixes give way first — the others, then the one it
    /// would use — then a less urgent running sequence (`classes.rs`); else it waits.
    fn cells_for<C: Compute>(
        &mut self,
        be: &mut C,
        i: usize,
        source: Option<(Source, usize)>,
    ) -> Room {
        if !self.cfg.is_unified() {
            return Room::Fits;
        }
        let need = self.waiting[i].tokens.len() - source.map_or(0, |(_, l)| l);
        let watermark = self.running.len();
        if self.demand() + need + watermark <= self.cfg.kv_cells {
            return Room::Fits;
        }
        let keep = match source {
            Some((Source::Cached { id }, _)) => Some(id),
            _ => None,
        };
        if self.evict_lru(be, keep) || self.evict_lru(be, None) {
            return Room::Retry;
        }
        let urgency = Some(self.waiting[i].urgency());
        if self.cfg.admission_control && self.bump_for(be, urgency) {
            return Room::Retry;
        }
        if self.cfg.admission_control && !self.running.is_empty() {
            return Room::Wait;
        }
        Room::Fits
    }

    /// A placed sequence starts running; the first time, it is told it was admitted.
    fn start(&mut self, mut a: Active) {
        if a.seq.admitted.is_none() {
            let now = Instant::now();
            a.seq.admitted = Some(now);
            self.admissions += 1;
            a.seq.shared_prompt_tokens = a.n_past.min(a.seq.n_prompt);
            EngineStats::add(&self.stats.shared_prompt_tokens, a.seq.shared_prompt_tokens);
            let _ = a.seq.tx.send(Event::Admitted {
                queue_time: now - a.seq.arrived,
                order: self.admissions,
            });
        }
        self.running.push(a);
    }

    /// Admits every waiting member of `gang` in this step, in a seeded random order (no member
    /// systematically first), or none of them: `false` when the slots (free, or cached ones
    /// that can be given up, less the `claimed` ones of deferred requests) or, in a unified
    /// cache, the cells cannot take them all now. Members do not wait for each other's prefix
    /// (they are admitted together); cached, stored and computed prefixes are reused as usual.
    fn admit_gang<C: Compute>(&mut self, be: &mut C, gang: u64, claimed: usize) -> bool {
        let mut members: Vec<u64> = self
            .waiting
            .iter()
            .filter(|s| s.gang == Some(gang))
            .map(|s| s.id)
            .collect();
        if self.gang_shortfall(gang, claimed) > 0 {
            return false;
        }
        if self.cfg.is_unified() {
            let need: usize = self
                .waiting
                .iter()
                .filter(|s| s.gang == Some(gang))
                .map(|s| s.tokens.len())
                .sum();
            while self.demand() + need + self.running.len() + members.len() > self.cfg.kv_cells {
                if self.evict_lru(be, None) {
                    continue;
                }
                if self.cfg.admission_control && !self.running.is_empty() {
                    return false;
                }
                break;
            }
        }
        // seeded Fisher-Yates: the order among members is the tie-break stream's
        for k in (1..members.len()).rev() {
            let j = self.rng.gen_range(0..=k);
            members.swap(k, j);
        }
        for id in members {
            let Some(i) = self.waiting.iter().position(|s| s.id == id) else {
                continue;
            };
            let cand = &self.waiting[i];
            let source = if cand.uses_prompt_cache() || cand.preemptions > 0 {
                self.find_source(&cand.tokens, cand.adapters, cand.own_tail(), true)
            } else {
                None
            };
            let source = match source {
                Some((Source::Running { ready: false, .. }, _)) => None,
                s => s,
            };
            let s = self.waiting.swap_remove(i);
            let Some(a) = self.place(be, s, source) else {
                // counted above, so not reached; the rest stay queued rather than fail
                tracing::warn!("gang {gang}: a member found no slot after the slots were counted");
                return true;
            };
            self.start(a);
        }
        true
    }

    /// Slots `gang` lacks: its waiting members plus the `claimed` slots of deferred requests,
    /// less the slots free or held by cached prefixes that can be given up.
    pub(super) fn gang_shortfall(&self, gang: u64, claimed: usize) -> usize {
        let members = self.waiting.iter().filter(|s| s.gang == Some(gang)).count();
        let obtainable = self.slots.len()
            + self
                .cache
                .iter()
                .filter(|c| !self.pinned.contains(&c.slot))
                .count();
        (members + claimed).saturating_sub(obtainable)
    }

    /// Gives `s` a slot and the KV of its reusable prefix. A cached slot is taken in place (cut
    /// back to the common prefix) when that keeps the running slots in runs of consecutive ids;
    /// otherwise the slot from [`Self::take_slot`] receives the prefix: restored from the store,
    /// or copied from the cached or running holder. `None` when no slot can be had (`s` back in
    /// the queue) or the source found for it is gone (a fault: `s` fails alone, named).
    fn place<C: Compute>(
        &mut self,
        be: &mut C,
        s: Seq,
        source: Option<(Source, usize)>,
    ) -> Option<Active> {
        let cached = match source {
            Some((Source::Cached { id }, len)) => Some((id, len)),
            _ => None,
        };
        let mut slot = None;
        if let Some((id, len)) = cached {
            let Some(in_place) = self.cache.iter().find(|c| c.id == id).map(|c| c.slot) else {
                self.fault(
                    s,
                    format!("cached prefix {id}, found in this admission, is gone"),
                );
                return None;
            };
            if !self.cfg.is_unified()
                && (!self.joins_a_run(in_place) || self.better_lane_free(in_place, s.adapters))
            {
                slot = self.take_slot(be, Some(id), s.adapters);
            }
            if slot.is_none() {
                // take_slot may have reordered the cache; `keep` left this entry in it
                let Some(k) = self.cache.iter().position(|c| c.id == id) else {
                    self.fault(s, format!("cached prefix {id}, kept by take_slot, is gone"));
                    return None;
                };
                let c = self.cache.swap_remove(k);
                be.truncate_seq(c.slot, len);
                self.cells.release(&c.cells[len..]);
                let mut cells = c.cells;
                cells.truncate(len);
                return Some(Active {
                    seq: s,
                    slot: c.slot,
                    n_past: len,
                    cells,
                    draft: Vec::new(),
                });
            }
        }
        let slot = match slot.or_else(|| self.take_slot(be, None, s.adapters)) {
            Some(slot) => slot,
            None => {
                self.waiting.push(s);
                return None;
            }
        };
        let Some((source, len)) = source else {
            return Some(Active {
                seq: s,
                slot,
                n_past: 0,
                cells: Vec::new(),
                draft: Vec::new(),
            });
        };
        self.give_prefix(be, s, slot, source, len)
    }

    /// Gives the sequence `s` in `slot` the first `len` positions of `source`: restored from
    /// the store, or copied from (split streams) or shared with (unified) the cached or running
    /// holder.
    fn give_prefix<C: Compute>(
        &mut self,
        be: &mut C,
        s: Seq,
        slot: i32,
        source: Source,
        len: usize,
    ) -> Option<Active> {
        self.clock += 1;
        let donor = match source {
            Source::Stored { id } => return self.restore(be, s, slot, id, len),
            Source::Cached { id } => {
                let Some(c) = self.cache.iter_mut().find(|c| c.id == id) else {
                    self.slots.give_back(slot);
                    self.fault(
                        s,
                        format!("cached prefix {id}, found in this admission, is gone"),
                    );
                    return None;
                };
                c.last_used = self.clock;
                // the copy lands at the next decode: nothing may be restored into c.slot before
                self.pinned.push(c.slot);
                (c.slot, None)
            }
            Source::Running { id, .. } => {
                let Some(r) = self.running.iter().find(|r| r.seq.id == id) else {
                    self.slots.give_back(slot);
                    self.fault(
                        s,
                        format!("running sequence {id}, found in this admission, is gone"),
                    );
                    return None;
                };
                (r.slot, Some(r.cells[..len].to_vec()))
            }
        };
        be.share_prefix(donor.0, slot, len);
        self.landing.push(slot);
        let cells = match donor.1 {
            Some(cells) if self.cfg.is_unified() => {
                self.cells.retain(&cells);
                cells
            }
            _ => {
                self.stats.prefix_copies.fetch_add(1, Ordering::Relaxed);
                self.cells.alloc_n(len)
            }
        };
        Some(Active {
            seq: s,
            slot,
            n_past: len,
            cells,
            draft: Vec::new(),
        })
    }

    /// Restores stored prefix `id` into `slot` for `s` (who computes its whole prompt if the
    /// backend refuses the state).
    fn restore<C: Compute>(
        &mut self,
        be: &mut C,
        s: Seq,
        slot: i32,
        id: u64,
        len: usize,
    ) -> Option<Active> {
        let Some(e) = self.store.entries.iter_mut().find(|e| e.id == id) else {
            self.slots.give_back(slot);
            self.fault(
                s,
                format!("stored prefix {id}, found in this admission, is gone"),
            );
            return None;
        };
        e.last_used = self.clock;
        if be.restore_seq(&e.snap, slot) {
            be.truncate_seq(slot, len);
            self.stats.prefix_restores.fetch_add(1, Ordering::Relaxed);
            return Some(Active {
                seq: s,
                slot,
                n_past: len,
                cells: self.cells.alloc_n(len),
                draft: Vec::new(),
            });
        }
        be.remove_seq(slot);
        Some(Active {
            seq: s,
            slot,
            n_past: 0,
            cells: Vec::new(),
            draft: Vec::new(),
        })
    }
}
