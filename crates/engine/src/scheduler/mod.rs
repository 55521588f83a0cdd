//! Continuous batching at iteration level over one llama.cpp context.
//!
//! Every step: drop cancelled sequences, admit waiting ones (see `admission.rs`), make room by
//! preemption if running sequences outgrow a unified cache, then build ONE batch with a token for
//! every decoding sequence plus prefill chunks, decode it, and sample (`batch.rs`) — one such
//! batch per LoRA adapter set among the running sequences (`step.rs`).
//!
//! KV accounting is exact and independent of llama.cpp (`kv.rs`): every position of every
//! sequence names the cell that holds it. With split streams (the default) every slot owns a
//! fixed stream of cells and a sequence never outgrows it; with a unified cache the scheduler
//! keeps `used cells + cells still to be filled by admitted sequences <= kv_cells`. Either way
//! it never asks llama.cpp for more KV than the memory plan sized.
//!
//! Prompt reuse: a request takes the longest computed prefix of its prompt from a finished
//! sequence's cached slot (in place, no copy) or from a running sequence (copied), and computes
//! only the rest. A request whose best prefix is still being computed by another waits for it
//! instead of computing it again (SGLang's in-batch rule), so concurrent requests of one variant
//! compute its system prompt once. KV is reused only under the adapter set that computed it.

mod abort;
mod admission;
mod batch;
mod classes;
mod itl;
mod kv;
mod lane_steps;
mod sample;
mod seq;
mod slots;
mod speculate;
mod stats;
mod step;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::adapters::AdapterSet;
use crate::lane_split::Lanes;
use crate::request::{EventSender, Request};
use crate::sampler::Sampler;
use crate::text::TextStream;

use kv::{Cached, CellTable, PrefixStore, SlotPool};
use seq::{Active, Seq};
pub use speculate::{DraftAsk, Speculation};
pub(crate) use stats::InFlight;
pub use stats::{ClassCounts, EngineStats, SetCounts, StatsSnapshot};

/// Part of a batch: `n` tokens of running sequence `idx` from batch index `first`, with the
/// logits to sample from at batch index `logits` (and, for forced tokens whose log-probabilities
/// are asked for, at the positions before each: see `sample.rs`; built by `batch.rs` and `lane_steps.rs`).
/// The last `draft` of the `n` are draft tokens, with logits at each after `logits`
/// (`speculate.rs`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Planned {
    pub idx: usize,
    pub n: usize,
    pub first: usize,
    pub logits: Option<usize>,
    pub draft: usize,
}

/// What the scheduler needs from a model + context. llama.cpp implements it in `llama/compute.rs`;
/// tests implement it with a tiny deterministic fake.
pub trait Compute {
    fn batch_capacity(&self) -> usize;
    fn clear_batch(&mut self);
    fn add(&mut self, token: i32, pos: usize, seq: i32, logits: bool);
    /// `Ok(false)`: no KV slot could be found for the batch.
    fn decode(&mut self) -> Result<bool, String>;
    fn logits(&self, batch_index: usize) -> &[f32];
    fn remove_seq(&mut self, seq: i32);
    /// Gives `dst` (which holds nothing) the KV of positions [0, len) of `src`.
    fn share_prefix(&mut self, src: i32, dst: i32, len: usize);
    /// Drops positions [len, ∞) of `seq`.
    fn truncate_seq(&mut self, seq: i32, len: usize);
    /// The KV of `seq` copied to host memory, with its size in bytes (the prefix store).
    fn save_seq(&mut self, seq: i32) -> Option<(Snapshot, usize)>;
    /// Loads a saved KV into `seq` (which holds nothing); false if the backend refused it.
    fn restore_seq(&mut self, snap: &Snapshot, seq: i32) -> bool;
    fn piece(&self, token: i32) -> Vec<u8>;
    fn is_eog(&self, token: i32) -> bool;
    /// Applies `set`'s LoRA adapters to the decodes that follow in adapter lane `lane` (the
    /// empty set: the base model). With one lane, `lane` is 0; with several, a batch holds
    /// tokens of several lanes, and `decode` runs each lane's under its own set.
    fn set_adapters(&mut self, lane: usize, set: &AdapterSet) -> Result<(), String>;
    /// Whether a draft model drafts (`--draft-model`, `speculate.rs`); without one, only
    /// prompt lookup does.
    fn has_draft_model(&self) -> bool {
        false
    }
    /// For each ask, up to `max` tokens the draft model predicts greedily after `tokens` (the
    /// sequence in `slot`, its last token not yet decoded by the model); `Err` when the draft
    /// model failed (the step goes on without drafts).
    fn draft(&mut self, asks: &[DraftAsk<'_>]) -> Result<Vec<Vec<i32>>, String> {
        let _ = asks;
        Err("no draft model".into())
    }
    /// How many of `tokens` the draft model's context would have to compute before drafting
    /// for `slot` (what drafting costs beyond the drafts themselves).
    fn draft_behind(&self, slot: i32, tokens: &[i32]) -> usize {
        let _ = (slot, tokens);
        usize::MAX
    }
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub kv_cells: usize,
    pub seq_slots: usize,
    /// Per-sequence context: prompt + generated tokens never exceed it.
    pub context: usize,
    /// `Some(cells)`: one KV stream of that many cells per slot (llama.cpp `kv_unified = false`);
    /// `None`: one unified pool of `kv_cells` cells.
    pub cells_per_slot: Option<usize>,
    /// Shortest common prefix worth reusing (`usize::MAX`: no reuse).
    pub min_shared_prefix: usize,
    /// Requests that arrive within this window of the oldest waiting one are admitted in
    /// random order, so no variant of a fan-out systematically goes first.
    pub fair_window: Duration,
    /// Test-only: admit without checking free KV cells (shows why the check matters).
    pub admission_control: bool,
    /// Inter-token latency target (see `itl.rs`); `None`: admit up to the slots and memory.
    pub max_itl: Option<Duration>,
    /// Host-memory prefix store in bytes (split streams only; 0: off).
    pub prefix_store_bytes: usize,
    /// Seed of the tie-break stream (fixed in tests).
    pub seed: u64,
    /// Append the tokens a grammar forces without sampling them (`sample.rs`); off, the mask
    /// admits them one per step.
    pub fast_forward: bool,
    /// Steps an adapter set keeps the context while sequences of other sets wait (`step.rs`):
    /// applying another set makes llama.cpp rebuild its compute graphs; 0 decodes every set in
    /// every step.
    pub adapter_turn: usize,
    /// Adapter lanes the slots are divided between (`crate::lane_split`; split streams only): each
    /// lane applies one set at a time, and every lane decodes in every step.
    pub lanes: usize,
    /// Speculative decoding by prompt lookup (`speculate.rs`).
    pub speculative: Speculation,
}

impl SchedulerConfig {
    /// A unified cache of `kv_cells` cells shared by up to `seq_slots` sequences.
    pub fn new(kv_cells: usize, seq_slots: usize, context: usize) -> Self {
        SchedulerConfig {
            kv_cells,
            seq_slots,
            context,
            cells_per_slot: None,
            min_shared_prefix: 16,
            fair_window: Duration::from_millis(20),
            admission_control: true,
            max_itl: None,
            prefix_store_bytes: 0,
            seed: 0x5eed,
            fast_forward: true,
            adapter_turn: 8,
            lanes: 1,
            speculative: Speculation::Off,
        }
    }

    #[cfg(test)]
    /// `seq_slots` streams of `cells_per_slot` cells each.
    pub fn split(seq_slots: usize, cells_per_slot: usize, context: usize) -> Self {
        SchedulerConfig {
            cells_per_slot: Some(cells_per_slot),
            ..Self::new(seq_slots * cells_per_slot, seq_slots, context)
        }
    }

    pub fn is_unified(&self) -> bool {
        self.cells_per_slot.is_none()
    }
}

/// A sequence's KV saved to host memory by [`Compute::save_seq`]; opaque to the scheduler.
pub type Snapshot = Box<dyn std::any::Any + Send>;

/// Called after every engine step with its duration (metrics histograms hang off this).
pub type StepObserver = Arc<dyn Fn(Duration) + Send + Sync>;

pub struct Scheduler {
    cfg: SchedulerConfig,
    waiting: Vec<Seq>,
    /// In admission order (newest last: the first to be preempted).
    running: Vec<Active>,
    slots: SlotPool,
    cells: CellTable,
    cache: Vec<Cached>,
    store: PrefixStore,
    rng: ChaCha8Rng,
    next_id: u64,
    stats: Arc<EngineStats>,
    observer: Option<StepObserver>,
    admissions: u64,
    clock: u64,
    steps: itl::StepModel,
    /// Tokens per second with and without drafts (`speculate.rs`).
    spec: speculate::SpecModel,
    /// Decode-only step times by rows (tokens) in the step, drafts included: what a row costs.
    rows: itl::StepModel,
    /// Cached slots that are the source of a stream copy not yet landed (llama.cpp copies
    /// streams at the next decode): nothing may be restored into them until then.
    pinned: Vec<i32>,
    /// Slots given a prefix copy not yet landed (its destinations): not preempted until then.
    landing: Vec<i32>,
    /// Group submissions so far (the last gang id).
    gangs: u64,
    /// Adapter sets seen, by id (`step.rs`); 0 is the base model.
    sets: Vec<AdapterSet>,
    /// The adapter set whose turn it is and the steps its turn has left (`step.rs`), per lane.
    turn: Vec<(u32, usize)>,
    /// The adapter set applied to each lane's context, as far as this scheduler applied one
    /// (by value: set ids are reused).
    on_lane: Vec<AdapterSet>,
    /// How the slots are divided between adapter lanes (one lane: all of them).
    lanes: Lanes,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, stats: Arc<EngineStats>) -> Self {
        stats
            .kv_cells_total
            .store(cfg.kv_cells as u64, Ordering::Relaxed);
        let store = PrefixStore::new(if cfg.is_unified() {
            0
        } else {
            cfg.prefix_store_bytes
        });
        let lanes = if cfg.is_unified() {
            Lanes::new(cfg.seq_slots, 1)
        } else {
            Lanes::new(cfg.seq_slots, cfg.lanes)
        };
        Scheduler {
            store,
            slots: SlotPool::new(cfg.seq_slots),
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            waiting: Vec::new(),
            running: Vec::new(),
            cells: CellTable::default(),
            cache: Vec::new(),
            next_id: 0,
            stats,
            observer: None,
            admissions: 0,
            clock: 0,
            steps: itl::StepModel::default(),
            spec: Default::default(),
            rows: Default::default(),
            pinned: Vec::new(),
            landing: Vec::new(),
            gangs: 0,
            sets: vec![AdapterSet::default()],
            turn: vec![(0, 0); lanes.count()],
            on_lane: vec![AdapterSet::default(); lanes.count()],
            lanes,
        }
    }

    pub fn set_observer(&mut self, obs: StepObserver) {
        self.observer = Some(obs);
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    #[cfg(test)]
    /// Every KV cell held, by running sequences and by cached prefixes.
    pub fn used_cells(&self) -> usize {
        self.cells.used()
    }

    /// Cells held by running sequences (cached prefixes excluded: they give way on demand).
    pub fn active_cells(&self) -> usize {
        let active: std::collections::HashSet<u32> = self
            .running
            .iter()
            .flat_map(|s| s.cells.iter().copied())
            .collect();
        active.len()
    }

    #[cfg(test)]
    /// Finished sequences whose prefixes are kept.
    pub fn cached_prefixes(&self) -> usize {
        self.cache.len()
    }

    #[cfg(test)]
    pub fn n_running(&self) -> usize {
        self.running.len()
    }

    fn caching(&self) -> bool {
        self.cfg.admission_control && self.cfg.min_shared_prefix != usize::MAX
    }

    #[cfg(test)]
    /// Queues a request with a place of its own, for callers (tests) that bypass the handle,
    /// which takes the place when a request is submitted.
    pub fn enqueue_counted(&mut self, req: Request, tx: EventSender) {
        let (_, mut permit) = InFlight::take(&self.stats, 1, req.class);
        self.enqueue(req, tx, permit.remove(0));
    }

    /// Queues a request that holds its place (`permit`) until it ends.
    pub(crate) fn enqueue(&mut self, req: Request, tx: EventSender, permit: InFlight) {
        let n_prompt = req.prompt.len();
        let limit = (n_prompt + req.params.max_tokens as usize).min(self.cfg.context);
        let adapters = self.intern(req.adapters);
        let seq = Seq {
            id: self.next_id,
            tokens: req.prompt,
            n_prompt,
            limit,
            text: TextStream::new(req.params.stop.clone()),
            sampler: Sampler::new(req.params),
            tx,
            group: req.group,
            kv_share: req.kv_share,
            probe: req.probe,
            class: req.class,
            priority: req.priority,
            arrived: Instant::now(),
            admitted: None,
            first_token: None,
            preemptions: 0,
            bumped: 0,
            shared_prompt_tokens: 0,
            gang: None,
            constraint: req.constraint,
            unemitted: 0,
            forced: 0,
            adapters,
            lease: req.lease,
            permit,
            acceptance: self.spec.prior(),
        };
        self.next_id += 1;
        EngineStats::add(&self.stats.prompt_tokens, n_prompt);
        self.waiting.push(seq);
        self.publish();
    }

    /// Cells held plus cells still to fill by running sequences (the unified-cache bound).
    fn demand(&self) -> usize {
        self.cells.used() + self.running.iter().map(Active::pending).sum::<usize>()
    }

    fn publish(&self) {
        {
            let mut g = self.stats.lock_groups();
            for v in g.values_mut() {
                v.0 = 0;
            }
            for s in &self.running {
                if let Some(name) = &s.seq.group {
                    let e = g.entry(name.clone()).or_insert((0, 0));
                    e.0 += s.cells.len() as u64;
                }
            }
            for v in g.values_mut() {
                v.1 = v.1.max(v.0);
            }
        }
        let used = self.active_cells() as u64;
        self.stats.kv_cells_used.store(used, Ordering::Relaxed);
        self.stats
            .kv_cells_cached
            .store(self.cells.used() as u64 - used, Ordering::Relaxed);
        self.stats.kv_cells_peak.fetch_max(used, Ordering::Relaxed);
        self.stats
            .running
            .store(self.running.len() as u64, Ordering::Relaxed);
        let grammars = self
            .running
            .iter()
            .filter_map(|a| a.seq.constraint.as_ref());
        self.stats.matchers(grammars);
        self.stats
            .waiting
            .store(self.waiting.len() as u64, Ordering::Relaxed);
        self.publish_classes();
    }

    fn reap_cancelled<C: Compute>(&mut self, be: &mut C) {
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.tx.is_closed());
        let mut cancelled = before - self.waiting.len();
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].seq.tx.is_closed() {
                let a = self.running.remove(i);
                self.release(be, a);
                cancelled += 1;
            } else {
                i += 1;
            }
        }
        if cancelled > 0 {
            EngineStats::add(&self.stats.cancellations, cancelled);
        }
    }

    /// Frees a running sequence's cells and slot; what is left waits or finishes.
    fn release<C: Compute>(&mut self, be: &mut C, a: Active) -> Seq {
        be.remove_seq(a.slot);
        self.slots.give_back(a.slot);
        self.cells.release(&a.cells);
        a.seq
    }

    /// Keeps a finished sequence's computed prefix in its slot for later requests.
    fn keep_prefix<C: Compute>(&mut self, be: &mut C, a: Active) -> Seq {
        if a.n_past < self.cfg.min_shared_prefix {
            return self.release(be, a);
        }
        let tokens = a.seq.tokens[..a.n_past].to_vec();
        // an older entry that this one extends is redundant
        while let Some(i) = self
            .cache
            .iter()
            .position(|c| c.set == a.seq.adapters && tokens.starts_with(&c.tokens))
        {
            let c = self.cache.swap_remove(i);
            self.drop_cached(be, c);
        }
        self.clock += 1;
        // the store keeps a copy unless it already holds what this sequence reused and at least
        // half its prompt (later requests of a variant do not store its system prompt again)
        let covered = a
            .seq
            .shared_prompt_tokens
            .max(a.seq.n_prompt / 2)
            .max(self.cfg.min_shared_prefix);
        if self.store.enabled() && self.store.best_common(a.seq.adapters, &tokens) < covered {
            self.save_to_store(be, a.slot, a.seq.id, a.seq.adapters, tokens.clone());
        }
        self.cache.push(Cached {
            id: a.seq.id,
            slot: a.slot,
            set: a.seq.adapters,
            tokens,
            cells: a.cells,
            last_used: self.clock,
        });
        a.seq
    }

    fn drop_cached<C: Compute>(&mut self, be: &mut C, c: Cached) {
        be.remove_seq(c.slot);
        self.slots.give_back(c.slot);
        self.cells.release(&c.cells);
    }

    /// Positions of cache entry `i` that no other cached entry and no running sequence holds
    /// (0: dropping it loses nothing those still have).
    pub(super) fn unique_positions(&self, i: usize) -> usize {
        let c = &self.cache[i];
        let shared_cached = self
            .cache
            .iter()
            .enumerate()
            .filter(|&(j, o)| j != i && o.set == c.set)
            .map(|(_, o)| kv::common_prefix(&o.tokens, &c.tokens))
            .max()
            .unwrap_or(0);
        let shared_running = self
            .running
            .iter()
            .filter(|a| a.seq.adapters == c.set)
            .map(|a| kv::common_prefix(&a.seq.tokens[..a.n_past], &c.tokens))
            .max()
            .unwrap_or(0);
        c.tokens.len() - shared_cached.max(shared_running)
    }

    /// Drops one cached prefix (never `keep`); false when there is none. The victim is the entry
    /// whose tokens are least uniquely held — the fewest positions past what another cached
    /// entry or a running sequence also holds — and among those the least recently used. So a
    /// variant's system prompt survives while copies of it go first: it is evicted only when no
    /// other holder has it (a radix cache evicting leaves before shared inner nodes).
    fn evict_lru<C: Compute>(&mut self, be: &mut C, keep: Option<u64>) -> bool {
        let victim = (0..self.cache.len())
            .filter(|&i| {
                Some(self.cache[i].id) != keep && !self.pinned.contains(&self.cache[i].slot)
            })
            .min_by_key(|&i| (self.unique_positions(i), self.cache[i].last_used));
        match victim {
            Some(i) => {
                let c = self.cache.swap_remove(i);
                self.drop_cached(be, c);
                true
            }
            None => false,
        }
    }

    #[cfg(test)]
    /// Drops every cached prefix.
    pub fn clear_cache<C: Compute>(&mut self, be: &mut C) {
        while self.evict_lru(be, None) {}
        self.publish();
    }

    /// Preempts the newest sequences until every running one can fill its pending cells
    /// (unified cache only: a split stream always holds its own sequence), and groups over
    /// their KV share give back their newest sequences.
    fn ensure_room<C: Compute>(&mut self, be: &mut C) {
        if !self.cfg.admission_control {
            return;
        }
        while self.cfg.is_unified() && self.demand() > self.cfg.kv_cells {
            // cached prefixes give way before running sequences do
            if self.evict_lru(be, None) {
                continue;
            }
            if self.running.len() <= 1 {
                break;
            }
            self.preempt_newest(be);
        }
        loop {
            let over = self.running.iter().rposition(|a| {
                let (Some(share), Some(g)) = (a.seq.kv_share, a.seq.group.as_deref()) else {
                    return false;
                };
                let members = self
                    .running
                    .iter()
                    .filter(|r| r.seq.group.as_deref() == Some(g))
                    .count();
                members > 1 && self.group_demand(g) > self.quota_cells(share)
            });
            match over {
                Some(i) => self.preempt_at(be, i),
                None => break,
            }
        }
    }

    /// Preempts for memory: the least urgent running sequence, the latest to arrive among
    /// equals (never a readiness probe while anything else can go).
    fn preempt_newest<C: Compute>(&mut self, be: &mut C) {
        let idx = self
            .least_urgent(|_| true)
            .unwrap_or(self.running.len() - 1);
        self.preempt_at(be, idx);
    }

    fn preempt_at<C: Compute>(&mut self, be: &mut C, idx: usize) {
        let a = self.running.remove(idx);
        let mut s = self.release(be, a);
        s.preemptions += 1;
        self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
        self.stats
            .class(s.class)
            .preemptions
            .fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            seq = s.id,
            tokens = s.tokens.len(),
            "preempted; will recompute"
        );
        self.waiting.push(s);
    }
    /// Running sequences per group and the cells they hold (the quota tests read it).
    #[cfg(test)]
    pub fn cells_by_group(&self) -> std::collections::HashMap<Option<String>, usize> {
        let mut m = std::collections::HashMap::new();
        for a in &self.running {
            *m.entry(a.seq.group.clone()).or_insert(0) += a.cells.len();
        }
        m
    }
}

#[cfg(test)]
mod tests;
