//! Which slot a new sequence takes (split streams): one next to the running ones, so that a
//! decode step over the running slots stays one micro-batch (llama.cpp batches only consecutive
//! sequence ids together), in its adapter set's lane, giving up a cached prefix only when it is
//! held elsewhere too (or the host store keeps it).

use super::{Compute, Scheduler};

impl Scheduler {
    /// Would a sequence in `slot` decode in a micro-batch with running ones? llama.cpp's split
    /// streams batch only consecutive sequence ids together: each separate run of ids is one
    /// more graph evaluation per step (~10 ms on 2 cores for this model, measured).
    pub(super) fn joins_a_run(&self, slot: i32) -> bool {
        self.running.is_empty() || self.next_to_running(slot)
    }

    /// A slot for a new sequence of adapter set `set`. Split streams: with adapter lanes, one
    /// in the best lane for `set` first (`lane_rank`); then a slot next to a running one if
    /// there is one, else the lowest, among the free slots and the cached ones (so running
    /// sequences stay in one run of consecutive ids); a cached prefix there is dropped unless
    /// it is `keep` or a pending copy's source, and — without a host store, which keeps
    /// finished prefixes — unless another cached slot or a running sequence holds it too.
    /// Unified: the lowest free slot. Either way, when no slot is free the least valuable
    /// cached prefix gives its slot up.
    pub(super) fn take_slot<C: Compute>(
        &mut self,
        be: &mut C,
        keep: Option<u64>,
        set: u32,
    ) -> Option<i32> {
        if !self.cfg.is_unified() {
            let best = self.open_slots(keep).into_iter().min_by_key(|&(slot, _)| {
                (self.lane_rank(slot, set), !self.next_to_running(slot), slot)
            });
            if let Some((slot, entry)) = best {
                if let Some(i) = entry {
                    let c = self.cache.swap_remove(i);
                    self.drop_cached(be, c);
                }
                let taken = self.slots.take(slot);
                debug_assert!(taken, "a free or just dropped slot");
                return Some(slot);
            }
        }
        if let Some(slot) = self.slots.take_lowest() {
            return Some(slot);
        }
        if !self.evict_lru(be, keep) {
            return None;
        }
        self.slots.take_lowest()
    }

    /// Slots a new sequence may take (split streams): the free ones, and the cached ones whose
    /// prefix may be dropped (not `keep`, not a pending copy's source, and — without a host
    /// store — held elsewhere too), each with its index in the cache.
    pub(super) fn open_slots(&self, keep: Option<u64>) -> Vec<(i32, Option<usize>)> {
        let droppable = (0..self.cache.len()).filter(|&i| {
            let c = &self.cache[i];
            Some(c.id) != keep
                && !self.pinned.contains(&c.slot)
                && (self.store.enabled() || self.held_elsewhere(i))
        });
        let cached = droppable.map(|i| (self.cache[i].slot, Some(i)));
        self.slots.iter().map(|s| (s, None)).chain(cached).collect()
    }

    fn next_to_running(&self, slot: i32) -> bool {
        self.running.iter().any(|r| (r.slot - slot).abs() == 1)
    }

    /// Is the prefix of cache entry `i` also in the host store, another cached slot or a
    /// running sequence (so dropping this copy loses nothing)?
    fn held_elsewhere(&self, i: usize) -> bool {
        let c = &self.cache[i];
        self.store
            .entries
            .iter()
            .any(|e| e.set == c.set && e.tokens.starts_with(&c.tokens))
            || self.unique_positions(i) == 0
    }
}
