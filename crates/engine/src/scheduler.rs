//! Continuous batching at iteration level over one KV cache.
//!
//! Every step: drop cancelled sequences, admit waiting ones whose KV demand fits the free cells,
//! make room by preemption if running sequences outgrow the cache, then build ONE batch with a
//! token for every decoding sequence plus prefill chunks, decode it, and sample.
//!
//! KV accounting is exact and independent of llama.cpp: every position of every sequence names
//! the cell that holds it, cells are reference-counted, and a prefix shared between sequences
//! (`seq_cp` in a unified cache) is counted once. The invariant the scheduler keeps is
//! `used cells + cells still to be filled by admitted sequences <= kv_tokens`, which is what
//! the memory plan sized the cache for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::request::{Completion, Event, EventSender, FinishReason, Request};
use crate::sampler::Sampler;
use crate::text::TextStream;

/// What the scheduler needs from a model + context. llama.cpp implements it in `engine.rs`;
/// tests implement it with a tiny deterministic fake.
pub trait Compute {
    fn batch_capacity(&self) -> usize;
    fn clear_batch(&mut self);
    fn add(&mut self, token: i32, pos: usize, seq: i32, logits: bool);
    /// `Ok(false)`: no KV slot could be found for the batch.
    fn decode(&mut self) -> Result<bool, String>;
    fn logits(&self, batch_index: usize) -> &[f32];
    fn remove_seq(&mut self, seq: i32);
    fn share_prefix(&mut self, src: i32, dst: i32, len: usize);
    fn piece(&self, token: i32) -> Vec<u8>;
    fn is_eog(&self, token: i32) -> bool;
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub kv_tokens: usize,
    pub seq_slots: usize,
    /// Per-sequence context: prompt + generated tokens never exceed it.
    pub context: usize,
    /// Shortest common prefix worth sharing.
    pub min_shared_prefix: usize,
    /// Requests that arrive within this window of the oldest waiting one are admitted in
    /// random order, so no variant of a fan-out systematically goes first.
    pub fair_window: Duration,
    /// Test-only: admit without checking free KV cells (shows why the check matters).
    pub admission_control: bool,
    /// Seed of the tie-break stream (fixed in tests).
    pub seed: u64,
}

impl SchedulerConfig {
    pub fn new(kv_tokens: usize, seq_slots: usize, context: usize) -> Self {
        SchedulerConfig {
            kv_tokens,
            seq_slots,
            context,
            min_shared_prefix: 16,
            fair_window: Duration::from_millis(20),
            admission_control: true,
            seed: 0x5eed,
        }
    }
}

/// Live counters, readable from any thread.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub kv_tokens_total: AtomicU64,
    pub kv_tokens_used: AtomicU64,
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    pub preemptions: AtomicU64,
    pub cancellations: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub shared_prompt_tokens: AtomicU64,
    pub steps: AtomicU64,
    pub last_step_micros: AtomicU64,
    pub completed: AtomicU64,
    /// Largest number of cells ever in use.
    pub kv_tokens_peak: AtomicU64,
    /// Requests submitted and not yet finished (queued in the channel, waiting or running).
    pub inflight: AtomicU64,
    /// Cells held only by cached prefixes of finished sequences (free on demand).
    pub kv_tokens_cached: AtomicU64,
    /// Cells held per group (experiment): (now, peak).
    pub groups: std::sync::Mutex<HashMap<String, (u64, u64)>>,
}

impl EngineStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            kv_tokens_total: l(&self.kv_tokens_total),
            kv_tokens_used: l(&self.kv_tokens_used),
            kv_tokens_peak: l(&self.kv_tokens_peak),
            running: l(&self.running),
            waiting: l(&self.waiting),
            preemptions: l(&self.preemptions),
            cancellations: l(&self.cancellations),
            prompt_tokens: l(&self.prompt_tokens),
            generated_tokens: l(&self.generated_tokens),
            shared_prompt_tokens: l(&self.shared_prompt_tokens),
            steps: l(&self.steps),
            completed: l(&self.completed),
        }
    }
}

#[derive(Debug, Clone, Copy, serde::Serialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub kv_tokens_total: u64,
    pub kv_tokens_used: u64,
    pub kv_tokens_peak: u64,
    pub running: u64,
    pub waiting: u64,
    pub preemptions: u64,
    pub cancellations: u64,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    pub shared_prompt_tokens: u64,
    pub steps: u64,
    pub completed: u64,
}

/// Called after every engine step with its duration (metrics histograms hang off this).
pub type StepObserver = Arc<dyn Fn(Duration) + Send + Sync>;

struct Seq {
    id: u64,
    slot: Option<i32>,
    /// Prompt followed by every generated token.
    tokens: Vec<i32>,
    n_prompt: usize,
    /// Positions already in the KV cache.
    n_past: usize,
    /// Cell id of each position in [0, n_past).
    cells: Vec<u32>,
    /// Waiting to take positions [0, len) from sequence `donor` once it has computed them.
    share: Option<(u64, usize)>,
    /// Hard stop: min(prompt + max_tokens, context).
    limit: usize,
    sampler: Sampler,
    text: TextStream,
    tx: EventSender,
    group: Option<String>,
    kv_share: Option<f64>,
    priority: bool,
    arrived: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    preemptions: u32,
    shared_prompt_tokens: usize,
}

impl Seq {
    /// Cells this sequence still has to fill before its next logits.
    fn pending(&self) -> usize {
        let have = self.share.map_or(self.n_past, |(_, l)| l.max(self.n_past));
        self.tokens.len() - have
    }
    fn generated(&self) -> usize {
        self.tokens.len() - self.n_prompt
    }
}

/// A finished sequence whose computed KV stays in the cache for later requests that start with
/// the same tokens (a variant's system prompt), until its cells or its slot are needed: then the
/// least recently used goes first. llama.cpp's server does this per slot (`cache_prompt`), vLLM
/// across requests (automatic prefix caching).
struct Cached {
    id: u64,
    slot: i32,
    /// Tokens whose KV the cells hold, position by position.
    tokens: Vec<i32>,
    cells: Vec<u32>,
    last_used: u64,
}

#[derive(Default)]
struct CellTable {
    refs: HashMap<u32, u32>,
    next: u32,
}

impl CellTable {
    fn alloc(&mut self) -> u32 {
        let id = self.next;
        self.next = self.next.wrapping_add(1);
        self.refs.insert(id, 1);
        id
    }
    fn retain(&mut self, ids: &[u32]) {
        for id in ids {
            *self.refs.get_mut(id).expect("shared cell is live") += 1;
        }
    }
    fn release(&mut self, ids: &[u32]) {
        for id in ids {
            let n = self.refs.get_mut(id).expect("released cell is live");
            *n -= 1;
            if *n == 0 {
                self.refs.remove(id);
            }
        }
    }
    fn used(&self) -> usize {
        self.refs.len()
    }
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    waiting: Vec<Seq>,
    /// In admission order (newest last: the first to be preempted).
    running: Vec<Seq>,
    free_slots: Vec<i32>,
    cells: CellTable,
    rng: ChaCha8Rng,
    next_id: u64,
    stats: Arc<EngineStats>,
    observer: Option<StepObserver>,
    admissions: u64,
    cache: Vec<Cached>,
    clock: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, stats: Arc<EngineStats>) -> Self {
        stats.kv_tokens_total.store(cfg.kv_tokens as u64, Ordering::Relaxed);
        Scheduler {
            free_slots: (0..cfg.seq_slots as i32).rev().collect(),
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            cfg,
            waiting: Vec::new(),
            running: Vec::new(),
            cells: CellTable::default(),
            next_id: 0,
            stats,
            observer: None,
            admissions: 0,
            cache: Vec::new(),
            clock: 0,
        }
    }

    pub fn set_observer(&mut self, obs: StepObserver) {
        self.observer = Some(obs);
    }

    pub fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Every KV cell held, by running sequences and by cached prefixes.
    pub fn used_cells(&self) -> usize {
        self.cells.used()
    }

    /// Cells held by running sequences (cached prefixes excluded: they give way on demand).
    pub fn active_cells(&self) -> usize {
        let active: std::collections::HashSet<u32> = self.running.iter().flat_map(|s| s.cells.iter().copied()).collect();
        active.len()
    }

    /// Finished sequences whose prefixes are kept.
    pub fn cached_prefixes(&self) -> usize {
        self.cache.len()
    }

    fn caching(&self) -> bool {
        self.cfg.admission_control && self.cfg.min_shared_prefix != usize::MAX
    }

    /// Keeps a finished sequence's computed prefix for later requests (see [`Cached`]).
    fn keep_prefix<C: Compute>(&mut self, be: &mut C, mut s: Seq) -> Seq {
        let Some(slot) = s.slot else { return self.release(be, s) };
        if s.n_past < self.cfg.min_shared_prefix || s.share.is_some() {
            return self.release(be, s);
        }
        let tokens = s.tokens[..s.n_past].to_vec();
        // an older entry that this one extends is redundant (its cells are shared with this one)
        while let Some(i) = self.cache.iter().position(|c| tokens.starts_with(&c.tokens)) {
            let c = self.cache.swap_remove(i);
            self.drop_cached(be, c);
        }
        self.clock += 1;
        self.cache.push(Cached { id: s.id, slot, tokens, cells: std::mem::take(&mut s.cells), last_used: self.clock });
        s.slot = None;
        s.n_past = 0;
        s
    }

    fn drop_cached<C: Compute>(&mut self, be: &mut C, c: Cached) {
        be.remove_seq(c.slot);
        self.free_slots.push(c.slot);
        self.cells.release(&c.cells);
    }

    /// Drops the least recently used cached prefix (not `keep`); false when there is none.
    fn evict_lru<C: Compute>(&mut self, be: &mut C, keep: Option<u64>) -> bool {
        let victim = self
            .cache
            .iter()
            .enumerate()
            .filter(|(_, c)| Some(c.id) != keep)
            .min_by_key(|(_, c)| c.last_used)
            .map(|(i, _)| i);
        match victim {
            Some(i) => {
                let c = self.cache.swap_remove(i);
                self.drop_cached(be, c);
                true
            }
            None => false,
        }
    }

    /// Drops every cached prefix.
    pub fn clear_cache<C: Compute>(&mut self, be: &mut C) {
        while self.evict_lru(be, None) {}
        self.publish();
    }

    pub fn n_running(&self) -> usize {
        self.running.len()
    }

    pub fn n_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Queues a request. The engine handle counted it in `inflight` when it was submitted;
    /// `enqueue_counted` is for callers (tests) that bypass the handle.
    pub fn enqueue_counted(&mut self, req: Request, tx: EventSender) {
        self.stats.inflight.fetch_add(1, Ordering::Relaxed);
        self.enqueue(req, tx);
    }

    pub fn enqueue(&mut self, req: Request, tx: EventSender) {
        let n_prompt = req.prompt.len();
        let limit = (n_prompt + req.params.max_tokens as usize).min(self.cfg.context);
        let seq = Seq {
            id: self.next_id,
            slot: None,
            tokens: req.prompt,
            n_prompt,
            n_past: 0,
            cells: Vec::new(),
            share: None,
            limit,
            text: TextStream::new(req.params.stop.clone()),
            sampler: Sampler::new(req.params),
            tx,
            group: req.group,
            kv_share: req.kv_share,
            priority: req.priority,
            arrived: Instant::now(),
            admitted: None,
            first_token: None,
            preemptions: 0,
            shared_prompt_tokens: 0,
        };
        self.next_id += 1;
        self.stats.prompt_tokens.fetch_add(n_prompt as u64, Ordering::Relaxed);
        self.waiting.push(seq);
        self.publish();
    }

    fn demand(&self) -> usize {
        self.cells.used() + self.running.iter().map(Seq::pending).sum::<usize>()
    }

    fn publish(&self) {
        {
            let mut g = self.stats.groups.lock().unwrap();
            for v in g.values_mut() {
                v.0 = 0;
            }
            for s in &self.running {
                if let Some(name) = &s.group {
                    let e = g.entry(name.clone()).or_insert((0, 0));
                    e.0 += s.cells.len() as u64;
                }
            }
            for v in g.values_mut() {
                v.1 = v.1.max(v.0);
            }
        }
        let used = self.active_cells() as u64;
        self.stats.kv_tokens_used.store(used, Ordering::Relaxed);
        self.stats.kv_tokens_cached.store(self.cells.used() as u64 - used, Ordering::Relaxed);
        self.stats.kv_tokens_peak.fetch_max(used, Ordering::Relaxed);
        self.stats.running.store(self.running.len() as u64, Ordering::Relaxed);
        self.stats.waiting.store(self.waiting.len() as u64, Ordering::Relaxed);
    }

    /// One iteration. Returns false when there was nothing to run.
    pub fn step<C: Compute>(&mut self, be: &mut C) -> bool {
        let t0 = Instant::now();
        self.reap_cancelled(be);
        self.admit(be);
        if self.running.is_empty() {
            self.publish();
            return false;
        }
        self.resolve_shares(be);
        self.ensure_room(be);
        let plan = loop {
            let plan = self.build_batch(be);
            if plan.is_empty() {
                self.publish();
                return false;
            }
            match be.decode() {
                Ok(true) => break plan,
                Ok(false) if self.evict_lru(be, None) => {
                    // llama.cpp found no room: cached prefixes go first
                    continue;
                }
                Ok(false) => {
                    // llama.cpp found no contiguous slot: free the newest sequence and retry
                    tracing::debug!("no KV slot for the batch; preempting");
                    if !self.cfg.admission_control {
                        // what a server without a memory plan does: the batch fails
                        self.fail_batch(be, &plan, "out of memory: no free KV cache cells for the batch (admission control is off)");
                        self.publish();
                        return true;
                    }
                    if self.running.len() <= 1 {
                        self.fail_batch(be, &plan, "no KV cache slot for a single sequence");
                        self.publish();
                        return true;
                    }
                    self.preempt_newest(be);
                }
                Err(e) => {
                    tracing::error!("llama_decode failed: {e}");
                    self.fail_batch(be, &plan, &format!("decode failed: {e}"));
                    self.publish();
                    return true;
                }
            }
        };
        self.after_decode(be, &plan);
        self.stats.steps.fetch_add(1, Ordering::Relaxed);
        let dt = t0.elapsed();
        self.stats.last_step_micros.store(dt.as_micros() as u64, Ordering::Relaxed);
        if let Some(obs) = &self.observer {
            obs(dt);
        }
        self.publish();
        true
    }

    fn reap_cancelled<C: Compute>(&mut self, be: &mut C) {
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.tx.is_closed());
        let mut cancelled = before - self.waiting.len();
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].tx.is_closed() {
                let s = self.running.remove(i);
                self.release(be, s);
                cancelled += 1;
            } else {
                i += 1;
            }
        }
        if cancelled > 0 {
            self.stats.cancellations.fetch_add(cancelled as u64, Ordering::Relaxed);
            self.stats.inflight.fetch_sub(cancelled as u64, Ordering::Relaxed);
        }
    }

    /// Frees a sequence's cells and slot.
    fn release<C: Compute>(&mut self, be: &mut C, mut s: Seq) -> Seq {
        if let Some(slot) = s.slot.take() {
            be.remove_seq(slot);
            self.free_slots.push(slot);
        }
        self.cells.release(&s.cells);
        s.cells.clear();
        s.n_past = 0;
        s.share = None;
        s
    }

    /// Index in `waiting` of the next request to admit: priority first, then a random pick among
    /// those that arrived within `fair_window` of the oldest.
    fn next_candidate(&mut self) -> Option<usize> {
        if let Some(i) = self.waiting.iter().position(|s| s.priority) {
            return Some(i);
        }
        let eligible: Vec<usize> = (0..self.waiting.len()).filter(|&i| !self.over_quota(&self.waiting[i])).collect();
        let oldest = eligible.iter().map(|&i| self.waiting[i].arrived).min()?;
        let window: Vec<usize> =
            eligible.into_iter().filter(|&i| self.waiting[i].arrived <= oldest + self.cfg.fair_window).collect();
        Some(window[self.rng.gen_range(0..window.len())])
    }

    /// Cells a group's running sequences hold or will fill.
    fn group_demand(&self, group: &str) -> usize {
        self.running
            .iter()
            .filter(|r| r.group.as_deref() == Some(group))
            .map(|r| r.cells.len() + r.pending())
            .sum()
    }

    /// Would admitting `s` take its group beyond its KV share? A group may always run one.
    fn over_quota(&self, s: &Seq) -> bool {
        let (Some(share), Some(group)) = (s.kv_share, s.group.as_deref()) else { return false };
        if !self.running.iter().any(|r| r.group.as_deref() == Some(group)) {
            return false;
        }
        self.group_demand(group) + s.tokens.len() > self.quota_cells(share)
    }

    /// Cells a KV share allows.
    fn quota_cells(&self, share: f64) -> usize {
        (share * self.cfg.kv_tokens as f64) as usize
    }

    /// Longest prefix of `tokens` another running sequence holds or will hold.
    fn find_share(&self, tokens: &[i32], use_cache: bool) -> Option<(u64, usize)> {
        let mut best: Option<(u64, usize)> = None;
        for r in &self.running {
            if r.share.is_some() && r.n_past == 0 {
                // itself waiting for a donor: chains are allowed only through computed cells
                continue;
            }
            let common = r.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count();
            // keep one token to compute so the sharer gets its own logits
            let l = common.min(tokens.len() - 1);
            if l >= self.cfg.min_shared_prefix && best.is_none_or(|(_, b)| l > b) {
                best = Some((r.id, l));
            }
        }
        for c in self.cache.iter().filter(|_| use_cache) {
            let common = c.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count();
            let l = common.min(tokens.len() - 1);
            if l >= self.cfg.min_shared_prefix && best.is_none_or(|(_, b)| l > b) {
                best = Some((c.id, l));
            }
        }
        best
    }

    fn admit<C: Compute>(&mut self, be: &mut C) {
        while !self.waiting.is_empty() {
            if self.free_slots.is_empty() && !self.evict_lru(be, None) {
                break;
            }
            // None: every waiting request belongs to a group at its KV quota
            let Some(i) = self.next_candidate() else { break };
            let share = self.find_share(&self.waiting[i].tokens, self.waiting[i].sampler.params().uses_prompt_cache());
            let need = self.waiting[i].tokens.len() - share.map_or(0, |(_, l)| l);
            let watermark = self.running.len();
            if self.demand() + need + watermark > self.cfg.kv_tokens {
                // cached prefixes give way first: the others, then the one this request would use
                if self.evict_lru(be, share.map(|s| s.0)) || self.evict_lru(be, None) {
                    continue;
                }
                if self.cfg.admission_control && !self.running.is_empty() {
                    break;
                }
            }
            let mut s = self.waiting.swap_remove(i);
            s.slot = self.free_slots.pop();
            s.share = share;
            if s.admitted.is_none() {
                let now = Instant::now();
                s.admitted = Some(now);
                self.admissions += 1;
                let _ = s.tx.send(Event::Admitted { queue_time: now - s.arrived, order: self.admissions });
            }
            self.running.push(s);
        }
    }

    /// Takes shared prefixes from donors that have computed them (running sequences or cached
    /// prefixes); drops shares whose donor left.
    fn resolve_shares<C: Compute>(&mut self, be: &mut C) {
        for i in 0..self.running.len() {
            let Some((donor, len)) = self.running[i].share else { continue };
            let source = if let Some(c) = self.cache.iter_mut().find(|c| c.id == donor) {
                self.clock += 1;
                c.last_used = self.clock;
                Some((c.cells[..len].to_vec(), c.slot))
            } else {
                match self.running.iter().position(|r| r.id == donor) {
                    Some(d) if self.running[d].n_past >= len && self.running[d].share.is_none() => {
                        Some((self.running[d].cells[..len].to_vec(), self.running[d].slot.expect("running has a slot")))
                    }
                    Some(_) => continue, // donor still computing
                    None => None,
                }
            };
            let Some((cells, src)) = source else {
                self.running[i].share = None;
                continue;
            };
            let dst = self.running[i].slot.expect("running has a slot");
            be.share_prefix(src, dst, len);
            self.cells.retain(&cells);
            let s = &mut self.running[i];
            s.cells = cells;
            s.n_past = len;
            s.share = None;
            if s.preemptions == 0 {
                s.shared_prompt_tokens = len.min(s.n_prompt);
                self.stats.shared_prompt_tokens.fetch_add(s.shared_prompt_tokens as u64, Ordering::Relaxed);
            }
        }
    }

    /// Preempts the newest sequences until every running one can fill its pending cells.
    fn ensure_room<C: Compute>(&mut self, be: &mut C) {
        if !self.cfg.admission_control {
            return;
        }
        while self.demand() > self.cfg.kv_tokens {
            // cached prefixes give way before running sequences do
            if self.evict_lru(be, None) {
                continue;
            }
            if self.running.len() <= 1 {
                break;
            }
            self.preempt_newest(be);
        }
        // groups that outgrew their KV share give back their newest sequences
        loop {
            let over = self.running.iter().rposition(|s| {
                let (Some(share), Some(g)) = (s.kv_share, s.group.as_deref()) else { return false };
                let members = self.running.iter().filter(|r| r.group.as_deref() == Some(g)).count();
                members > 1 && self.group_demand(g) > self.quota_cells(share)
            });
            match over {
                Some(i) => self.preempt_at(be, i),
                None => break,
            }
        }
    }

    fn preempt_newest<C: Compute>(&mut self, be: &mut C) {
        // never preempt a readiness probe while anything else can go
        let idx = self
            .running
            .iter()
            .rposition(|s| !s.priority)
            .unwrap_or(self.running.len() - 1);
        self.preempt_at(be, idx);
    }

    fn preempt_at<C: Compute>(&mut self, be: &mut C, idx: usize) {
        let s = self.running.remove(idx);
        let id = s.id;
        let mut s = self.release(be, s);
        s.preemptions += 1;
        self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(seq = id, tokens = s.tokens.len(), "preempted; will recompute");
        // sharers of the victim lose their donor
        for r in &mut self.running {
            if r.share.is_some_and(|(d, _)| d == id) {
                r.share = None;
            }
        }
        self.waiting.push(s);
    }

    /// Fills the batch: one token per decoding sequence first, then prefill chunks in admission
    /// order. Returns (running index, tokens added, batch index of logits if requested).
    fn build_batch<C: Compute>(&mut self, be: &mut C) -> Vec<(usize, usize, Option<usize>)> {
        be.clear_batch();
        let mut cap = be.batch_capacity();
        let mut plan = Vec::new();
        let mut pos = 0usize;
        for pass in 0..2 {
            for (i, s) in self.running.iter().enumerate() {
                if s.share.is_some() {
                    continue;
                }
                let pending = s.tokens.len() - s.n_past;
                let decoding = pending == 1;
                if (pass == 0) != decoding || cap == 0 {
                    continue;
                }
                let n = pending.min(cap);
                let slot = s.slot.expect("running has a slot");
                let reaches_end = s.n_past + n == s.tokens.len();
                for k in 0..n {
                    let p = s.n_past + k;
                    be.add(s.tokens[p], p, slot, reaches_end && k == n - 1);
                }
                plan.push((i, n, reaches_end.then_some(pos + n - 1)));
                pos += n;
                cap -= n;
            }
        }
        plan
    }

    fn fail_batch<C: Compute>(&mut self, be: &mut C, plan: &[(usize, usize, Option<usize>)], msg: &str) {
        let mut idx: Vec<usize> = plan.iter().map(|p| p.0).collect();
        idx.sort_unstable();
        for &i in idx.iter().rev() {
            let s = self.running.remove(i);
            // release also drops the sequence from llama.cpp's cache, not only from our accounting
            let s = self.release(be, s);
            self.stats.inflight.fetch_sub(1, Ordering::Relaxed);
            let _ = s.tx.send(Event::Error(msg.to_string()));
        }
    }

    fn after_decode<C: Compute>(&mut self, be: &mut C, plan: &[(usize, usize, Option<usize>)]) {
        let mut finished = Vec::new();
        for &(i, n, logits_at) in plan {
            for _ in 0..n {
                let c = self.cells.alloc();
                self.running[i].cells.push(c);
            }
            self.running[i].n_past += n;
            let Some(bi) = logits_at else { continue };
            let s = &mut self.running[i];
            let recent_start = s.tokens.len().saturating_sub(crate::sampler::PENALTY_LAST_N);
            let (tok, logprob) = s.sampler.sample(be.logits(bi), &s.tokens[recent_start..]);
            s.sampler.accept(tok);
            s.tokens.push(tok);
            s.first_token.get_or_insert_with(Instant::now);
            self.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
            let eog = be.is_eog(tok) && !s.sampler.params().ignore_eos;
            let mut finish = None;
            if eog {
                finish = Some(FinishReason::Stop);
                let _ = s.tx.send(Event::Token { token: tok, text: String::new(), logprob });
            } else {
                let push = s.text.push(&be.piece(tok));
                let _ = s.tx.send(Event::Token { token: tok, text: push.text, logprob });
                if push.stopped {
                    finish = Some(FinishReason::Stop);
                }
            }
            if finish.is_none() && s.tokens.len() >= s.limit {
                finish = Some(FinishReason::Length);
            }
            if let Some(f) = finish {
                finished.push((i, f));
            }
        }
        finished.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        for &(i, reason) in &finished {
            let s = self.running.remove(i);
            let mut s = if self.caching() { self.keep_prefix(be, s) } else { self.release(be, s) };
            let now = Instant::now();
            let admitted = s.admitted.unwrap_or(s.arrived);
            let done = Completion {
                finish_reason: reason,
                prompt_tokens: s.n_prompt,
                completion_tokens: s.generated(),
                shared_prompt_tokens: s.shared_prompt_tokens,
                preemptions: s.preemptions,
                queue_time: admitted - s.arrived,
                time_to_first_token: s.first_token.unwrap_or(now) - s.arrived,
                total_time: now - s.arrived,
                tail_text: s.text.finish(),
            };
            let _ = s.tx.send(Event::Done(done));
            self.stats.completed.fetch_add(1, Ordering::Relaxed);
            self.stats.inflight.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Drops everything (engine shutdown): waiting and running get an error event.
    pub fn abort_all<C: Compute>(&mut self, be: &mut C, msg: &str) {
        for s in std::mem::take(&mut self.waiting) {
            self.stats.inflight.fetch_sub(1, Ordering::Relaxed);
            let _ = s.tx.send(Event::Error(msg.into()));
        }
        while let Some(s) = self.running.pop() {
            let s = self.release(be, s);
            self.stats.inflight.fetch_sub(1, Ordering::Relaxed);
            let _ = s.tx.send(Event::Error(msg.into()));
        }
        while self.evict_lru(be, None) {}
        self.publish();
    }

    /// Running sequences per group and the cells they hold (for quotas and tests).
    pub fn cells_by_group(&self) -> HashMap<Option<String>, usize> {
        let mut m = HashMap::new();
        for s in &self.running {
            *m.entry(s.group.clone()).or_insert(0) += s.cells.len();
        }
        m
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
