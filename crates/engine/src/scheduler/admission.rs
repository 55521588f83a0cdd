//! Admission: which waiting request goes next, where its prompt's KV comes from, and whether
//! memory, its group's KV share and the inter-token-latency target let it in.
//!
//! Prefix sources, longest first (ties: cached slot, then the host-memory store, then a running
//! sequence): a cached slot is taken in place; a stored prefix is restored into a free slot; a
//! running sequence's stream is copied.
//!
//! Order: readiness probes first; then, among requests that arrived within `fair_window` of the
//! oldest eligible one, a seeded random pick (the variants of a fan-out do not go in loop order).
//! A request whose longest reusable prefix is still being computed by a running sequence is
//! deferred until that sequence has computed it (it then copies it instead of computing it
//! again) — and keeps its claim on a slot meanwhile, so the variants whose prefixes are ready
//! first do not take every slot; a request over its group's KV share waits for the group to
//! shrink.

use std::collections::HashSet;
use std::time::Instant;

use rand::Rng;

use super::kv::common_prefix;
use super::seq::{Active, Seq};
use super::stats::EngineStats;
use super::{Compute, Scheduler};
use crate::request::Event;
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

impl Scheduler {
    /// Index in `waiting` of the next request to admit: priority first, then a random pick among
    /// the eligible ones that arrived within `fair_window` of the oldest eligible one.
    fn next_candidate(&mut self, deferred: &HashSet<u64>) -> Option<usize> {
        if let Some(i) = self.waiting.iter().position(|s| s.priority) {
            return Some(i);
        }
        let eligible: Vec<usize> = (0..self.waiting.len())
            .filter(|&i| !deferred.contains(&self.waiting[i].id) && !self.over_quota(&self.waiting[i]))
            .collect();
        let oldest = eligible.iter().map(|&i| self.waiting[i].arrived).min()?;
        let window: Vec<usize> =
            eligible.into_iter().filter(|&i| self.waiting[i].arrived <= oldest + self.cfg.fair_window).collect();
        Some(window[self.rng.gen_range(0..window.len())])
    }

    /// Cells a group's running sequences hold or will fill.
    pub(super) fn group_demand(&self, group: &str) -> usize {
        self.running.iter().filter(|r| r.seq.group.as_deref() == Some(group)).map(|r| r.cells.len() + r.pending()).sum()
    }

    /// Would admitting `s` take its group beyond its KV share? A group may always run one.
    fn over_quota(&self, s: &Seq) -> bool {
        let (Some(share), Some(group)) = (s.kv_share, s.group.as_deref()) else { return false };
        if !self.running.iter().any(|r| r.seq.group.as_deref() == Some(group)) {
            return false;
        }
        self.group_demand(group) + s.tokens.len() > self.quota_cells(share)
    }

    /// Cells a KV share allows.
    pub(super) fn quota_cells(&self, share: f64) -> usize {
        (share * self.cfg.kv_tokens as f64) as usize
    }

    /// Longest prefix of `tokens` that a cached slot or a running sequence holds or will hold
    /// (at least `min_shared_prefix`, and never the whole prompt: the last prompt token is
    /// always computed so the request gets its own logits). On equal length a cached slot wins
    /// (taken in place, no copy), then the host store, then a running sequence (copied).
    pub(super) fn find_source(&self, tokens: &[i32], use_cache: bool) -> Option<(Source, usize)> {
        if self.cfg.min_shared_prefix == usize::MAX || tokens.len() <= 1 {
            return None;
        }
        let usable = |common: usize| {
            let l = common.min(tokens.len() - 1);
            (l >= self.cfg.min_shared_prefix).then_some(l)
        };
        // holders in tie-break order (a later one must be strictly longer to win); a running
        // holder is ready once it has computed the common positions
        let cached = self.cache.iter().filter(|_| use_cache).map(|c| (Source::Cached { id: c.id }, &c.tokens, None));
        let stored = self.store.entries.iter().filter(|_| use_cache).map(|e| (Source::Stored { id: e.id }, &e.tokens, None));
        let running = self.running.iter().map(|r| (Source::Running { id: r.seq.id, ready: false }, &r.seq.tokens, Some(r.n_past)));
        let mut best: Option<(Source, usize)> = None;
        for (mut source, held, n_past) in cached.chain(stored).chain(running) {
            let Some(l) = usable(common_prefix(held, tokens)) else { continue };
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
        let mut itl_held = 0;
        while !self.waiting.is_empty() {
            // a deferred request keeps its claim on a slot: later requests of a variant whose
            // prefix happens to be ready first must not take every slot (fairness)
            if self.slots.len() + self.cache.len() <= deferred.len() {
                break;
            }
            // None: every waiting request is deferred or belongs to a group at its KV quota
            let Some(i) = self.next_candidate(&deferred) else { break };
            let cand = &self.waiting[i];
            let source = if cand.uses_prompt_cache() || cand.preemptions > 0 {
                // a preempted sequence may take back what it computed before from anywhere
                self.find_source(&cand.tokens, true)
            } else {
                // no cache: the prompt is computed whole (bit-identical logits for a seed)
                None
            };
            if let Some((Source::Running { ready: false, .. }, _)) = source {
                if !cand.priority {
                    // another running sequence is computing this prefix: take it when it is done
                    deferred.insert(cand.id);
                    continue;
                }
            }
            if let (Some(target), false) = (self.cfg.max_itl, cand.priority) {
                if !self.steps.allows_one_more(self.running.len(), target) {
                    itl_held = self.waiting.len();
                    break;
                }
            }
            let shared = source.map_or(0, |(_, l)| l);
            if self.cfg.is_unified() {
                let need = cand.tokens.len() - shared;
                let watermark = self.running.len();
                if self.demand() + need + watermark > self.cfg.kv_tokens {
                    // cached prefixes give way first: the others, then the one this request would use
                    let keep = match source {
                        Some((Source::Cached { id }, _)) => Some(id),
                        _ => None,
                    };
                    if self.evict_lru(be, keep) || self.evict_lru(be, None) {
                        continue;
                    }
                    if self.cfg.admission_control && !self.running.is_empty() {
                        break;
                    }
                }
            }
            let s = self.waiting.swap_remove(i);
            let Some(mut a) = self.place(be, s, source) else { break };
            if a.seq.admitted.is_none() {
                let now = Instant::now();
                a.seq.admitted = Some(now);
                self.admissions += 1;
                a.seq.shared_prompt_tokens = a.n_past.min(a.seq.n_prompt);
                EngineStats::add(&self.stats.shared_prompt_tokens, a.seq.shared_prompt_tokens);
                let _ = a.seq.tx.send(Event::Admitted { queue_time: now - a.seq.arrived, order: self.admissions });
            }
            self.running.push(a);
        }
        self.stats.itl_held.store(itl_held as u64, Ordering::Relaxed);
    }

    /// Gives `s` a slot and the KV of its reusable prefix. A cached slot is taken in place (cut
    /// back to the common prefix); otherwise the lowest free slot (evicting the least recently
    /// used cached prefix if none is free) receives a copy from the running source. `None`
    /// (with `s` back in the queue) when no slot can be had.
    fn place<C: Compute>(&mut self, be: &mut C, s: Seq, source: Option<(Source, usize)>) -> Option<Active> {
        if let Some((Source::Cached { id }, len)) = source {
            let k = self.cache.iter().position(|c| c.id == id).expect("source found in this admission");
            let c = self.cache.swap_remove(k);
            be.truncate_seq(c.slot, len);
            self.cells.release(&c.cells[len..]);
            let mut cells = c.cells;
            cells.truncate(len);
            return Some(Active { seq: s, slot: c.slot, n_past: len, cells });
        }
        let slot = match self.slots.take_lowest() {
            Some(slot) => slot,
            None => {
                if !self.evict_lru(be, None) {
                    self.waiting.push(s);
                    return None;
                }
                self.slots.take_lowest().expect("an evicted cached prefix frees its slot")
            }
        };
        if let Some((Source::Stored { id }, len)) = source {
            self.clock += 1;
            let e = self.store.entries.iter_mut().find(|e| e.id == id).expect("source found in this admission");
            e.last_used = self.clock;
            if be.restore_seq(&e.snap, slot) {
                be.truncate_seq(slot, len);
                self.stats.prefix_restores.fetch_add(1, Ordering::Relaxed);
                return Some(Active { seq: s, slot, n_past: len, cells: self.cells.alloc_n(len) });
            }
            be.remove_seq(slot);
            return Some(Active { seq: s, slot, n_past: 0, cells: Vec::new() });
        }
        let Some((Source::Running { id, .. }, len)) = source else {
            return Some(Active { seq: s, slot, n_past: 0, cells: Vec::new() });
        };
        let donor = self.running.iter().find(|r| r.seq.id == id).expect("source found in this admission");
        be.share_prefix(donor.slot, slot, len);
        let cells = if self.cfg.is_unified() {
            let cells = donor.cells[..len].to_vec();
            self.cells.retain(&cells);
            cells
        } else {
            self.stats.prefix_copies.fetch_add(1, Ordering::Relaxed);
            self.cells.alloc_n(len)
        };
        Some(Active { seq: s, slot, n_past: len, cells })
    }
}
