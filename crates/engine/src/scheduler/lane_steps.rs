//! Steps over adapter lanes (`crate::lane_split`): every lane decodes in every step, each under the
//! adapter set whose turn it is in that lane, all in one batch that the backend splits by lane
//! and runs side by side. A new sequence goes to a slot of a lane that already runs only its
//! set, else of an idle lane (one that has its set applied first, so that lanes keep their
//! sets when they empty together), else of a lane that runs its set among others, else of any
//! lane (which then takes turns between its sets, as one context does) — but only when no lane
//! runs its set: while one does, it waits for a slot there (`waits_for_lane`), and requests of
//! other sets may take the free slots meanwhile. Turns on a lane halve its sequences' pace; waiting
//! for a slot of one's own lane costs at most one sequence's remaining generation.
//!
//! Invariants: a sequence is decoded only in a step in which its lane has its set applied (the
//! batch holds, per lane, only the picked set's sequences); a lane with running sequences
//! decodes in every step unless applying its set failed (those sequences then fail, named).

use super::seq::Seq;
use super::step::next_in_turn;
use super::Planned;
use super::{Compute, Scheduler};

/// `lane_rank` of a slot in a lane that runs other sets only.
const FOREIGN: u8 = 4;

impl Scheduler {
    /// How well a slot suits a new sequence of set `set`: 0 in a lane whose running sequences
    /// are all of `set`; in an idle lane 1 if `set` is the one applied there (no change), else
    /// 2; 3 in a lane that runs `set` among others; [`FOREIGN`] in a lane that does not run
    /// `set` (joining adds a set to its turns). Always 0 with one lane.
    pub(super) fn lane_rank(&self, slot: i32, set: u32) -> u8 {
        if self.lanes.count() == 1 {
            return 0;
        }
        let lane = self.lanes.lane_of(slot);
        let (mut own, mut other) = (false, false);
        for a in self
            .running
            .iter()
            .filter(|a| self.lanes.lane_of(a.slot) == lane)
        {
            if a.seq.adapters == set {
                own = true;
            } else {
                other = true;
            }
        }
        match (own, other) {
            (true, false) => 0,
            (false, false) if self.on_lane[lane] == self.sets[set as usize] => 1,
            (false, false) => 2,
            (true, true) => 3,
            (false, true) => FOREIGN,
        }
    }

    /// Whether a free slot suits set `set` better than `slot` does (`lane_rank`).
    pub(super) fn better_lane_free(&self, slot: i32, set: u32) -> bool {
        if self.lanes.count() == 1 {
            return false;
        }
        let here = self.lane_rank(slot, set);
        self.slots.iter().any(|s| self.lane_rank(s, set) < here)
    }

    /// Whether waiting request `s` should wait for a slot in its set's own lane: every slot it
    /// could take (`open_slots`) is in a lane that does not run its set (joining would add a
    /// set to that lane's turns), while some running sequence of the set holds a lane that will
    /// free a slot. With no sequence of its set running it never waits (it takes the best slot
    /// there is, so a set without a lane of its own still runs); nor does a readiness probe.
    pub(super) fn waits_for_lane(&self, s: &Seq) -> bool {
        let set = s.adapters;
        if self.lanes.count() == 1 || s.probe || !self.running.iter().any(|a| a.seq.adapters == set)
        {
            return false;
        }
        let open = self.open_slots(None);
        open.iter().all(|&(s, _)| self.lane_rank(s, set) == FOREIGN)
    }

    /// The running sets of lane `lane`, each once, by id.
    fn lane_sets(&self, lane: usize) -> Vec<u32> {
        let mut sets: Vec<u32> = self
            .running
            .iter()
            .filter(|a| self.lanes.lane_of(a.slot) == lane && a.pending() > 0)
            .map(|a| a.seq.adapters)
            .collect();
        sets.sort_unstable();
        sets.dedup();
        sets
    }

    /// One decode over every lane: each lane's set in turn applied to its context, then one
    /// batch of those sets' sequences. `Err(ran)` as `decode_batch`.
    pub(super) fn decode_lanes<C: Compute>(&mut self, be: &mut C) -> Result<Vec<Planned>, bool> {
        let mut pick = vec![None; self.lanes.count()];
        let mut ran = false;
        for (lane, picked) in pick.iter_mut().enumerate() {
            let sets = self.lane_sets(lane);
            if sets.is_empty() {
                continue;
            }
            let set = next_in_turn(&mut self.turn[lane], &sets, self.cfg.adapter_turn);
            if self.apply_set(be, lane, set) {
                *picked = Some(set);
            } else {
                ran = true;
            }
        }
        if pick.iter().all(Option::is_none) {
            return Err(ran);
        }
        self.decode_batch(be, &pick).map_err(|r| r || ran)
    }
}
