//! Adapter lanes: the sequence slots divided between several llama.cpp contexts on the one
//! model's weights. Each context applies its own LoRA adapter set, and the contexts decode side
//! by side, so sequences of different sets need not take turns on one context (whose every set
//! change makes llama.cpp reserve its compute graphs again: docs/adapters.md, "The options,
//! measured").
//!
//! Invariants: lane `l` holds the contiguous slots `[start(l), start(l + 1))` (sizes differ by
//! at most one); a slot id is the scheduler's (global), and a lane's context numbers its
//! sequences from 0 (`local`); with one lane, `local(slot) == slot`.

/// How `slots` sequence slots are divided between `count` lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lanes {
    slots: usize,
    count: usize,
}

impl Lanes {
    /// `lanes` lanes over `slots` slots (at least one lane, at most one per slot).
    pub fn new(slots: usize, lanes: usize) -> Self {
        let slots = slots.max(1);
        Lanes {
            slots,
            count: lanes.clamp(1, slots),
        }
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// The first slot of lane `l` (`count()` gives the slot count).
    pub fn start(&self, l: usize) -> usize {
        l * self.slots / self.count
    }

    /// How many slots lane `l` holds.
    pub fn len(&self, l: usize) -> usize {
        self.start(l + 1) - self.start(l)
    }

    /// The lane of `slot`: the `l` with `start(l) <= slot < start(l + 1)`.
    pub fn lane_of(&self, slot: i32) -> usize {
        if self.count == 1 {
            return 0;
        }
        ((slot as usize + 1) * self.count - 1) / self.slots
    }

    /// `slot`'s sequence id in its lane's context.
    pub fn local(&self, slot: i32) -> i32 {
        slot - self.start(self.lane_of(slot)) as i32
    }
}

#[cfg(test)]
mod tests {
    use super::Lanes;

    #[test]
    fn every_slot_is_in_exactly_one_lane_and_lanes_are_contiguous() {
        for slots in 1..40 {
            for count in 1..=slots + 2 {
                let l = Lanes::new(slots, count);
                assert_eq!(l.count(), count.min(slots));
                assert_eq!(l.start(0), 0);
                assert_eq!(l.start(l.count()), slots);
                let sizes: Vec<usize> = (0..l.count()).map(|k| l.len(k)).collect();
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
                for s in 0..slots as i32 {
                    let k = l.lane_of(s);
                    assert!(
                        l.start(k) as i32 <= s && s < l.start(k + 1) as i32,
                        "{slots} {count} {s}"
                    );
                    assert_eq!(l.local(s), s - l.start(k) as i32);
                }
            }
        }
    }

    #[test]
    fn one_lane_keeps_slot_ids() {
        let l = Lanes::new(8, 1);
        assert!((0..8).all(|s| l.lane_of(s) == 0 && l.local(s) == s));
    }
}
