//! KV bookkeeping, exact and independent of llama.cpp: which slots (llama.cpp sequence ids) are
//! free, which cells hold what, and which finished sequences left a reusable prefix behind.
//!
//! Two layouts (`SchedulerConfig::cells_per_slot`):
//! - **split streams** (default): every slot owns a fixed stream of `cells_per_slot` cells; a
//!   sequence never exceeds its context, so it always fits its own stream and memory is decided
//!   by the slot count alone. Giving a prefix to another slot copies it (llama.cpp copies the
//!   whole stream, the scheduler then cuts it back), so copied positions are new cells.
//! - **unified**: one pool of `kv_cells` cells; a shared prefix is the same cells with a second
//!   sequence id (reference-counted here), and admission/preemption keep
//!   `used cells + cells still to fill <= kv_cells`.
//!
//! Invariant checked by the tests after every step: `CellTable::used()` equals the number of
//! cells llama.cpp (or the fake model) holds.

use std::collections::{BTreeSet, HashMap};

#[derive(Default)]
pub(super) struct CellTable {
    refs: HashMap<u32, u32>,
    next: u32,
}

impl CellTable {
    pub fn alloc(&mut self) -> u32 {
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        self.refs.insert(id, 1);
        id
    }
    pub fn alloc_n(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.alloc()).collect()
    }
    /// Another holder of the same cells (unified cache sharing). Unknown ids are ignored: they
    /// would mean an accounting bug, which the tests' cell-count check catches.
    pub fn retain(&mut self, ids: &[u32]) {
        for id in ids {
            if let Some(n) = self.refs.get_mut(id) {
                *n += 1;
            }
        }
    }
    pub fn release(&mut self, ids: &[u32]) {
        for id in ids {
            if let Some(n) = self.refs.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    self.refs.remove(id);
                }
            }
        }
    }
    pub fn used(&self) -> usize {
        self.refs.len()
    }
}

/// Free slots, lowest first: llama.cpp's split-stream batches take consecutive sequence ids in
/// one micro-batch, so running sequences packed at the low ids decode in fewer graph runs.
pub(super) struct SlotPool {
    free: BTreeSet<i32>,
}

impl SlotPool {
    pub fn new(n: usize) -> Self {
        SlotPool {
            free: (0..n as i32).collect(),
        }
    }
    pub fn take_lowest(&mut self) -> Option<i32> {
        self.free.pop_first()
    }
    pub fn iter(&self) -> impl Iterator<Item = i32> + '_ {
        self.free.iter().copied()
    }
    pub fn take(&mut self, slot: i32) -> bool {
        self.free.remove(&slot)
    }
    pub fn give_back(&mut self, slot: i32) {
        debug_assert!(!self.free.contains(&slot), "slot {slot} freed twice");
        self.free.insert(slot);
    }
    pub fn len(&self) -> usize {
        self.free.len()
    }
}

/// A finished sequence whose computed KV stays in its slot for later requests that start with
/// the same tokens (a variant's system prompt), until its slot or cells are needed: then the
/// least recently used goes first. llama.cpp's server does this per slot (`cache_prompt`), vLLM
/// across requests (automatic prefix caching).
pub(super) struct Cached {
    pub id: u64,
    pub slot: i32,
    /// The adapter set that computed the KV (the scheduler's id for it; 0: the base model).
    pub set: u32,
    /// Tokens whose KV the cells hold, position by position.
    pub tokens: Vec<i32>,
    pub cells: Vec<u32>,
    pub last_used: u64,
}

/// Length of the common prefix of two token lists.
pub(super) fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// A prefix saved to host memory (llama.cpp sequence state), restorable into any free slot:
/// a variant's system prompt outlives the slot that computed it. Bounded in bytes (counted in
/// the memory plan), least recently used first out.
pub(super) struct Stored {
    pub id: u64,
    /// The adapter set that computed the KV.
    pub set: u32,
    pub tokens: Vec<i32>,
    pub snap: super::Snapshot,
    pub bytes: usize,
    pub last_used: u64,
}

#[derive(Default)]
pub(super) struct PrefixStore {
    pub entries: Vec<Stored>,
    pub bytes: usize,
    pub cap: usize,
}

impl PrefixStore {
    pub fn new(cap: usize) -> Self {
        PrefixStore {
            entries: Vec::new(),
            bytes: 0,
            cap,
        }
    }
    pub fn enabled(&self) -> bool {
        self.cap > 0
    }
    /// Longest common prefix any entry computed under adapter set `set` has with `tokens`.
    pub fn best_common(&self, set: u32, tokens: &[i32]) -> usize {
        self.entries
            .iter()
            .filter(|e| e.set == set)
            .map(|e| common_prefix(&e.tokens, tokens))
            .max()
            .unwrap_or(0)
    }
    /// Adds an entry, dropping entries it extends or that have its id (a preempted sequence
    /// stored before), and then the least recently used until it
    /// fits. An entry larger than the whole store is not kept.
    pub fn insert(&mut self, e: Stored) {
        if e.bytes > self.cap {
            return;
        }
        self.entries
            .retain(|o| o.id != e.id && !(o.set == e.set && e.tokens.starts_with(&o.tokens)));
        self.bytes = self.entries.iter().map(|o| o.bytes).sum();
        while self.bytes + e.bytes > self.cap {
            let Some(i) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used) else {
                break;
            };
            self.bytes -= self.entries.swap_remove(i).bytes;
        }
        self.bytes += e.bytes;
        self.entries.push(e);
    }
}
