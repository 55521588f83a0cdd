//! Scheduler tests on a fake model whose next token is a hash of every token the sequence has
//! in the KV cache, so a wrong shared prefix, a wrong copy or a wrong recompute changes the
//! output. The fake keeps llama.cpp's two KV layouts: one unified pool, or one fixed stream per
//! sequence id where a prefix can only be given by copying a whole stream.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::*;
use crate::request::{Completion, Event, FinishReason, Request};
use std::sync::atomic::Ordering;
use std::time::Duration;
use crate::sampler::SamplingParams;

const VOCAB: usize = 100;
const EOG: i32 = 1;

struct FakeCell {
    pos: usize,
    token: i32,
    seqs: BTreeSet<i32>,
}

struct Fake {
    cap: usize,
    /// Split streams: cells [k·per, (k+1)·per) belong to sequence k.
    per_stream: Option<usize>,
    /// Graph evaluations llama.cpp would run (split streams: one per micro-batch of
    /// consecutive sequence ids with equal token counts).
    ubatches: usize,
    /// Micro-batches of each decode call, in order.
    per_decode: Vec<usize>,
    /// Stream copies (src, dst) recorded but not landed: llama.cpp copies the tensors at the
    /// next decode, so restoring into a source or saving a destination before then is a bug.
    pending: Vec<(i32, i32)>,
    /// How often each (history) was computed as the last token of a decode: keyed by a hash of
    /// the sequence's tokens up to and including that position.
    computed: HashMap<u64, usize>,
    cells: Vec<Option<FakeCell>>,
    batch: Vec<(i32, usize, i32, bool)>,
    logits: Vec<Vec<f32>>,
    out_index: HashMap<usize, usize>,
    no_slot: usize,
    peak_used: usize,
    /// Emit end-of-generation when the hash says so (off: sequences run to max_tokens).
    eog: bool,
}

impl Fake {
    fn new(cap: usize) -> Self {
        Fake {
            cap,
            cells: (0..cap).map(|_| None).collect(),
            batch: vec![],
            logits: vec![],
            out_index: HashMap::new(),
            no_slot: 0,
            peak_used: 0,
            eog: false,
            per_stream: None,
            ubatches: 0,
            per_decode: vec![],
            pending: vec![],
            computed: HashMap::new(),
        }
    }
    fn split(slots: usize, per: usize) -> Self {
        Fake { per_stream: Some(per), ..Fake::new(slots * per) }
    }
    fn stream(&self, seq: i32) -> std::ops::Range<usize> {
        match self.per_stream {
            Some(per) => seq as usize * per..(seq as usize + 1) * per,
            None => 0..self.cap,
        }
    }
    /// llama.cpp's split_equal(sequential) over the batch: micro-batches it would run.
    fn count_ubatches(&self) -> usize {
        if self.per_stream.is_none() {
            return 1;
        }
        let mut left: Vec<(i32, usize)> = Vec::new(); // (seq, tokens) in batch order
        for &(_, _, seq, _) in &self.batch {
            match left.iter_mut().find(|(s, _)| *s == seq) {
                Some(e) => e.1 += 1,
                None => left.push((seq, 1)),
            }
        }
        let mut n = 0;
        while left.iter().any(|e| e.1 > 0) {
            let mut set: Vec<usize> = Vec::new();
            for (k, e) in left.iter().enumerate() {
                if e.1 == 0 {
                    continue;
                }
                if set.is_empty() || e.0 == left[*set.last().unwrap()].0 + 1 {
                    set.push(k);
                }
            }
            let take = set.iter().map(|&k| left[k].1).min().unwrap();
            for &k in &set {
                left[k].1 -= take;
            }
            n += 1;
        }
        n
    }
    fn used(&self) -> usize {
        self.cells.iter().filter(|c| c.is_some()).count()
    }
    fn history(&self, seq: i32, upto: usize) -> Vec<i32> {
        let mut v: Vec<(usize, i32)> = self
            .cells
            .iter()
            .flatten()
            .filter(|c| c.seqs.contains(&seq) && c.pos <= upto)
            .map(|c| (c.pos, c.token))
            .collect();
        v.sort();
        assert!(v.iter().enumerate().all(|(i, (p, _))| *p == i), "seq {seq} has a hole in its KV");
        v.into_iter().map(|x| x.1).collect()
    }
}

fn next_token(history: &[i32], eog: bool) -> i32 {
    let mut h: u64 = 1469598103934665603;
    for &t in history {
        h = (h ^ t as u64).wrapping_mul(1099511628211);
    }
    if eog && h % 17 == 0 {
        EOG
    } else {
        2 + (h % (VOCAB as u64 - 2)) as i32
    }
}

impl Compute for Fake {
    fn batch_capacity(&self) -> usize {
        32
    }
    fn clear_batch(&mut self) {
        self.batch.clear();
    }
    fn add(&mut self, token: i32, pos: usize, seq: i32, logits: bool) {
        self.batch.push((token, pos, seq, logits));
    }
    fn decode(&mut self) -> Result<bool, String> {
        let mut taken: Vec<usize> = Vec::new();
        for &(_, _, seq, _) in &self.batch {
            match self.stream(seq).find(|&i| self.cells[i].is_none() && !taken.contains(&i)) {
                Some(i) => taken.push(i),
                None => {
                    self.no_slot += 1;
                    return Ok(false);
                }
            }
        }
        self.pending.clear();
        let n = self.count_ubatches();
        self.ubatches += n;
        self.per_decode.push(n);
        for (k, &(token, pos, seq, _)) in self.batch.iter().enumerate() {
            self.cells[taken[k]] = Some(FakeCell { pos, token, seqs: [seq].into() });
        }
        for &(_, pos, seq, want) in &self.batch {
            if want {
                let mut h: u64 = 7;
                for t in self.history(seq, pos) {
                    h = (h ^ t as u64).wrapping_mul(1099511628211);
                }
                *self.computed.entry(h).or_insert(0) += 1;
            }
        }
        self.peak_used = self.peak_used.max(self.used());
        self.logits.clear();
        self.out_index.clear();
        for (bi, &(_, pos, seq, want)) in self.batch.iter().enumerate() {
            if want {
                let t = next_token(&self.history(seq, pos), self.eog);
                let mut l = vec![0.0; VOCAB];
                l[t as usize] = 10.0;
                self.out_index.insert(bi, self.logits.len());
                self.logits.push(l);
            }
        }
        Ok(true)
    }
    fn logits(&self, batch_index: usize) -> &[f32] {
        &self.logits[self.out_index[&batch_index]]
    }
    fn remove_seq(&mut self, seq: i32) {
        for c in self.cells.iter_mut() {
            if let Some(cell) = c {
                cell.seqs.remove(&seq);
                if cell.seqs.is_empty() {
                    *c = None;
                }
            }
        }
    }
    fn share_prefix(&mut self, src: i32, dst: i32, len: usize) {
        assert!(self.cells.iter().flatten().all(|c| !c.seqs.contains(&dst)), "share into a sequence that holds cells");
        match self.per_stream {
            None => {
                for cell in self.cells.iter_mut().flatten() {
                    if cell.seqs.contains(&src) && cell.pos < len {
                        cell.seqs.insert(dst);
                    }
                }
            }
            Some(_) => {
                // llama.cpp copies the whole stream; the backend then cuts it back to `len`
                self.pending.push((src, dst));
                let (s, d) = (self.stream(src), self.stream(dst));
                for (i, j) in s.zip(d) {
                    self.cells[j] = self.cells[i]
                        .as_ref()
                        .map(|c| FakeCell { pos: c.pos, token: c.token, seqs: [dst].into() });
                }
                self.truncate_seq(dst, len);
            }
        }
    }
    fn save_seq(&mut self, seq: i32) -> Option<(Snapshot, usize)> {
        assert!(self.pending.iter().all(|p| p.1 != seq), "saved sequence {seq} before its copy landed");
        let cells: Vec<(usize, i32)> =
            self.cells.iter().flatten().filter(|c| c.seqs.contains(&seq)).map(|c| (c.pos, c.token)).collect();
        let n = cells.len() * 8;
        Some((Box::new(cells), n))
    }
    fn restore_seq(&mut self, snap: &Snapshot, seq: i32) -> bool {
        assert!(self.pending.iter().all(|p| p.0 != seq), "restored into {seq} before the copy from it landed");
        assert!(self.cells.iter().flatten().all(|c| !c.seqs.contains(&seq)), "restore into a sequence that holds cells");
        let cells = snap.downcast_ref::<Vec<(usize, i32)>>().expect("fake snapshot");
        let free: Vec<usize> = self.stream(seq).filter(|&i| self.cells[i].is_none()).collect();
        if free.len() < cells.len() {
            return false;
        }
        for (k, &(pos, token)) in cells.iter().enumerate() {
            self.cells[free[k]] = Some(FakeCell { pos, token, seqs: [seq].into() });
        }
        true
    }
    fn truncate_seq(&mut self, seq: i32, len: usize) {
        for c in self.cells.iter_mut() {
            if let Some(cell) = c {
                if cell.pos >= len && cell.seqs.remove(&seq) && cell.seqs.is_empty() {
                    *c = None;
                }
            }
        }
    }
    fn piece(&self, token: i32) -> Vec<u8> {
        format!("<{token}>").into_bytes()
    }
    fn is_eog(&self, token: i32) -> bool {
        token == EOG
    }
}

fn submit(s: &mut Scheduler, prompt: Vec<i32>, max_tokens: u32, group: &str) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    s.enqueue_counted(
        Request { prompt, params: SamplingParams::greedy(max_tokens), group: Some(group.into()), priority: false, kv_share: None },
        tx,
    );
    rx
}

fn drain(rx: &mut UnboundedReceiver<Event>) -> (Vec<i32>, Option<Completion>) {
    let mut toks = vec![];
    let mut done = None;
    while let Ok(e) = rx.try_recv() {
        match e {
            Event::Token { token, .. } => toks.push(token),
            Event::Done(c) => done = Some(c),
            Event::Error(e) => panic!("unexpected error {e}"),
            Event::Admitted { .. } => {}
        }
    }
    (toks, done)
}

fn run(s: &mut Scheduler, f: &mut Fake) {
    let mut guard = 0;
    while !s.is_idle() {
        s.step(f);
        assert!(s.used_cells() <= s.cfg.kv_tokens, "accounting exceeded the cache");
        assert_eq!(s.used_cells(), f.used(), "accounting disagrees with the cache");
        guard += 1;
        assert!(guard < 100_000, "scheduler did not finish");
    }
}

fn sched(kv: usize, slots: usize, ctx: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig::new(kv, slots, ctx), Arc::new(EngineStats::default()))
}

fn prompt(seed: i32, len: usize) -> Vec<i32> {
    (0..len as i32).map(|i| 2 + (seed * 31 + i * 7).rem_euclid(90)).collect()
}

fn solo(p: &[i32], max_tokens: u32) -> Vec<i32> {
    let mut s = sched(4096, 4, 1024);
    let mut f = Fake::new(4096);
    let mut rx = submit(&mut s, p.to_vec(), max_tokens, "solo");
    run(&mut s, &mut f);
    drain(&mut rx).0
}

#[test]
fn overload_preempts_and_preempted_sequences_equal_their_solo_runs() {
    let kv = 96;
    let mut s = sched(kv, 8, 64);
    let mut f = Fake::new(kv);
    let prompts: Vec<Vec<i32>> = (0..8).map(|i| prompt(i, 8 + i as usize)).collect();
    // demand: 8 × (8..15 + 30) ≈ 380 cells, four times the cache
    let mut rxs: Vec<_> = prompts.iter().map(|p| submit(&mut s, p.clone(), 30, "g")).collect();
    run(&mut s, &mut f);
    assert_eq!(f.no_slot, 0, "admission control must keep llama.cpp from running out of slots");
    assert!(s.stats.preemptions.load(Ordering::Relaxed) > 0, "this load must preempt");
    for (p, rx) in prompts.iter().zip(rxs.iter_mut()) {
        let (toks, done) = drain(rx);
        let done = done.expect("every sequence completes");
        assert_eq!(toks, solo(p, 30), "crowded run differs from the solo run");
        assert_eq!(done.completion_tokens, 30);
    }
    assert_eq!(s.active_cells(), 0);
    s.clear_cache(&mut f);
    assert_eq!(s.used_cells(), 0);
    assert_eq!(f.used(), 0);
}

#[test]
fn a_finished_prefix_is_reused_by_a_later_request_with_the_same_tokens() {
    let system = prompt(5, 40);
    let with = |tail: &[i32]| {
        let mut p = system.clone();
        p.extend_from_slice(tail);
        p
    };
    let mut s = sched(4096, 8, 256);
    let mut f = Fake::new(4096);
    let mut first = submit(&mut s, with(&[7, 8, 9]), 6, "v1");
    run(&mut s, &mut f);
    assert_eq!(drain(&mut first).0, solo(&with(&[7, 8, 9]), 6));
    assert_eq!(s.cached_prefixes(), 1);
    assert_eq!(s.active_cells(), 0, "a cached prefix is not counted as in use");
    assert_eq!(s.stats.kv_tokens_cached.load(Ordering::Relaxed), 40 + 3 + 5);
    // a later request with the same system prompt computes only what differs
    let p2 = with(&[11, 12]);
    let mut second = submit(&mut s, p2.clone(), 6, "v1");
    run(&mut s, &mut f);
    let (toks, done) = drain(&mut second);
    assert_eq!(toks, solo(&p2, 6), "the reused prefix gives the same tokens as computing it");
    assert_eq!(done.unwrap().shared_prompt_tokens, 40);
    // the same prompt again: everything but its last token comes from the cache
    let mut third = submit(&mut s, p2.clone(), 6, "v1");
    run(&mut s, &mut f);
    let (toks, done) = drain(&mut third);
    assert_eq!(toks, solo(&p2, 6));
    assert_eq!(done.unwrap().shared_prompt_tokens, p2.len() - 1);
    assert_eq!(s.stats.preemptions.load(Ordering::Relaxed), 0);
    // a seeded request computes its whole prompt (bit-identical logits every time) unless it
    // asks for the cache
    for (cache_prompt, shared) in [(None, 0), (Some(true), p2.len() - 1)] {
        let (tx, mut rx) = unbounded_channel();
        let params = SamplingParams { seed: Some(7), cache_prompt, ..SamplingParams::greedy(6) };
        s.enqueue_counted(Request { prompt: p2.clone(), params, group: None, priority: false, kv_share: None }, tx);
        run(&mut s, &mut f);
        assert_eq!(drain(&mut rx).1.unwrap().shared_prompt_tokens, shared, "cache_prompt {cache_prompt:?}");
    }
}

#[test]
fn cached_prefixes_give_way_to_new_work_before_anything_is_preempted() {
    let kv = 256;
    let mut s = sched(kv, 4, 128);
    let mut f = Fake::new(kv);
    // four finished sequences leave 4 × 59 cells cached and hold every slot
    for i in 0..4 {
        let mut rx = submit(&mut s, prompt(10 + i, 50), 10, "old");
        run(&mut s, &mut f);
        assert!(drain(&mut rx).1.is_some());
    }
    assert_eq!(s.cached_prefixes(), 4);
    assert_eq!(s.used_cells(), 4 * 59, "the last sampled token of each never entered the cache");
    // new, unrelated work that needs most of the cache and every slot
    let prompts: Vec<Vec<i32>> = (0..4).map(|i| prompt(50 + i, 40)).collect();
    let mut rxs: Vec<_> = prompts.iter().map(|p| submit(&mut s, p.clone(), 20, "new")).collect();
    run(&mut s, &mut f);
    assert_eq!(f.no_slot, 0);
    assert_eq!(s.stats.preemptions.load(Ordering::Relaxed), 0, "the cache gave way, nothing running was preempted");
    for (p, rx) in prompts.iter().zip(rxs.iter_mut()) {
        assert_eq!(drain(rx).0, solo(p, 20));
    }
    assert!(s.used_cells() <= kv);
}

#[test]
fn shared_prefix_is_counted_once_and_gives_the_same_tokens() {
    let base = prompt(3, 40);
    let prompts: Vec<Vec<i32>> = (0..8)
        .map(|i| {
            let mut p = base.clone();
            p.extend([2 + i, 3 + i]);
            p
        })
        .collect();
    let mut s = sched(4096, 8, 256);
    let mut f = Fake::new(4096);
    let mut rxs: Vec<_> = prompts.iter().map(|p| submit(&mut s, p.clone(), 4, "g")).collect();
    run(&mut s, &mut f);
    let unshared: usize = prompts.iter().map(|p| p.len() + 4).sum();
    assert!(f.peak_used * 3 <= unshared, "peak {} cells vs {} unshared", f.peak_used, unshared);
    assert!(s.stats.shared_prompt_tokens.load(Ordering::Relaxed) >= 7 * 40);
    for (p, rx) in prompts.iter().zip(rxs.iter_mut()) {
        assert_eq!(drain(rx).0, solo(p, 4));
    }
}

#[test]
fn cancellation_frees_cells_on_the_next_step() {
    let mut s = sched(1024, 4, 512);
    let mut f = Fake::new(1024);
    let mut keep = submit(&mut s, prompt(1, 20), 100, "g");
    let gone = submit(&mut s, prompt(2, 20), 100, "g");
    for _ in 0..5 {
        s.step(&mut f);
    }
    let owners = |f: &Fake| f.cells.iter().flatten().flat_map(|c| c.seqs.iter().copied()).collect::<BTreeSet<i32>>();
    assert_eq!(owners(&f).len(), 2);
    drop(gone);
    s.step(&mut f);
    // one step later only the kept sequence holds cells
    assert_eq!(owners(&f).len(), 1);
    assert_eq!(s.used_cells(), f.used());
    assert_eq!(s.stats.cancellations.load(Ordering::Relaxed), 1);
    drop(keep.try_recv());
}

#[test]
fn admission_is_fair_between_variants_submitted_in_a_fixed_order() {
    let mut first_a = 0;
    let rounds = 200;
    let mut s = sched(4096, 1, 512);
    let mut f = Fake::new(4096);
    for r in 0..rounds {
        let mut a = submit(&mut s, prompt(r, 5), 1, "A");
        let _b = submit(&mut s, prompt(r, 5), 1, "B");
        s.step(&mut f);
        // one slot: exactly one of the two finished in the first step
        if drain(&mut a).1.is_some() {
            first_a += 1;
        }
        run(&mut s, &mut f);
    }
    let share = first_a as f64 / rounds as f64;
    assert!((0.4..=0.6).contains(&share), "variant A went first {share:.2} of the time");
}

#[test]
fn without_admission_control_the_cache_runs_out() {
    let kv = 48;
    let mut cfg = SchedulerConfig::new(kv, 8, 64);
    cfg.admission_control = false;
    let mut s = Scheduler::new(cfg, Arc::new(EngineStats::default()));
    let mut f = Fake::new(kv);
    let _rxs: Vec<_> = (0..8).map(|i| submit(&mut s, prompt(i, 10), 30, "g")).collect();
    for _ in 0..200 {
        s.step(&mut f);
    }
    assert!(f.no_slot > 0, "the fake cache should have refused a batch");
}

#[test]
fn eog_stops_and_stop_strings_cut() {
    let mut s = sched(4096, 4, 512);
    let mut f = Fake::new(4096);
    f.eog = true;
    let mut rxs: Vec<_> = (0..20).map(|i| submit(&mut s, prompt(i, 6), 200, "g")).collect();
    run(&mut s, &mut f);
    let stopped = rxs
        .iter_mut()
        .map(|rx| drain(rx).1.unwrap().finish_reason)
        .filter(|r| *r == FinishReason::Stop)
        .count();
    assert!(stopped > 0, "some sequences should hit the end-of-generation token");
    // stop string on the fake's "<n>" pieces
    let (tx, mut rx) = unbounded_channel();
    let p = prompt(7, 6);
    let first = solo(&p, 1)[0];
    s.enqueue_counted(
        Request {
            prompt: p,
            params: SamplingParams { stop: vec![format!("<{first}>")], ..SamplingParams::greedy(50) },
            group: None,
            priority: false,
            kv_share: None,
        },
        tx,
    );
    f.eog = false;
    run(&mut s, &mut f);
    let (toks, done) = drain(&mut rx);
    assert_eq!(toks.len(), 1);
    assert_eq!(done.unwrap().finish_reason, FinishReason::Stop);
}

#[test]
fn a_group_with_a_kv_share_never_holds_more_and_others_keep_running() {
    let kv = 400;
    let mut s = sched(kv, 16, 128);
    let mut f = Fake::new(kv);
    let mut flood = vec![];
    for i in 0..12 {
        let (tx, rx) = unbounded_channel();
        s.enqueue_counted(
            Request { prompt: prompt(i, 20), params: SamplingParams::greedy(40), group: Some("capped".into()), priority: false, kv_share: Some(0.25) },
            tx,
        );
        flood.push(rx);
    }
    let mut others: Vec<_> = (0..4).map(|i| submit(&mut s, prompt(100 + i, 10), 20, "free")).collect();
    let mut guard = 0;
    while !s.is_idle() {
        s.step(&mut f);
        let held = s.cells_by_group().get(&Some("capped".to_string())).copied().unwrap_or(0);
        assert!(held <= kv / 4, "capped group holds {held} of {kv} cells");
        guard += 1;
        assert!(guard < 100_000);
    }
    for rx in others.iter_mut().chain(flood.iter_mut()) {
        assert!(drain(rx).1.is_some(), "every request completes");
    }
    let peak = s.stats.groups().into_iter().find(|g| g.0 == "capped").unwrap().2;
    assert!(peak as usize <= kv / 4 && peak > 0);
}

// ---- split KV streams (the default layout) ----

fn split_sched(slots: usize, per: usize, ctx: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig::split(slots, per, ctx), Arc::new(EngineStats::default()))
}

fn with_system(system: &[i32], tail: &[i32]) -> Vec<i32> {
    let mut p = system.to_vec();
    p.extend_from_slice(tail);
    p
}

#[test]
fn split_streams_run_more_requests_than_slots_without_preemption_and_equal_solo_runs() {
    let mut s = split_sched(4, 64, 64);
    let mut f = Fake::split(4, 64);
    let prompts: Vec<Vec<i32>> = (0..12).map(|i| prompt(i, 8 + i as usize)).collect();
    let mut rxs: Vec<_> = prompts.iter().map(|p| submit(&mut s, p.clone(), 30, "g")).collect();
    run(&mut s, &mut f);
    assert_eq!(f.no_slot, 0);
    assert_eq!(s.stats.preemptions.load(Ordering::Relaxed), 0, "a split stream always holds its sequence");
    for (p, rx) in prompts.iter().zip(rxs.iter_mut()) {
        let (toks, done) = drain(rx);
        assert_eq!(toks, solo(p, 30));
        assert_eq!(done.unwrap().completion_tokens, 30);
    }
    assert!(s.used_cells() <= 4 * 64);
}

#[test]
fn split_streams_reuse_a_slot_in_place_and_copy_from_running_slots() {
    let system = prompt(9, 40);
    let mut s = split_sched(4, 128, 128);
    let mut f = Fake::split(4, 128);
    // 16 requests of one variant one after another: the system prompt is computed once
    let mut computed = 0;
    for i in 0..16 {
        let p = with_system(&system, &[2 + i, 3, 4 + i]);
        let mut rx = submit(&mut s, p.clone(), 5, "v");
        run(&mut s, &mut f);
        let (toks, done) = drain(&mut rx);
        assert_eq!(toks, solo(&p, 5), "request {i}");
        if i > 0 {
            assert!(done.unwrap().shared_prompt_tokens >= 40, "request {i} reused the system prompt");
        }
        computed = s.stats.prompt_tokens_computed.load(Ordering::Relaxed);
    }
    assert_eq!(computed, 40 + 16 * 3, "the 40-token system prompt was computed once");
    assert_eq!(s.stats.prefix_copies.load(Ordering::Relaxed), 0, "one after another: always the same slot, no copy");
    // four at once: the first takes the cached slot in place, the others copy its stream
    let prompts: Vec<Vec<i32>> = (0..4).map(|i| with_system(&system, &[50 + i, 51])).collect();
    let mut rxs: Vec<_> = prompts.iter().map(|p| submit(&mut s, p.clone(), 5, "v")).collect();
    run(&mut s, &mut f);
    for (p, rx) in prompts.iter().zip(rxs.iter_mut()) {
        let (toks, done) = drain(rx);
        assert_eq!(toks, solo(p, 5), "a copied stream gives the tokens of a computed one");
        assert!(done.unwrap().shared_prompt_tokens >= 40);
    }
    assert_eq!(s.stats.prefix_copies.load(Ordering::Relaxed), 3);
    assert_eq!(s.stats.prompt_tokens_computed.load(Ordering::Relaxed), computed + 4 * 2);
}

#[test]
fn concurrent_requests_wait_for_a_prefix_in_computation_instead_of_computing_it_again() {
    // 8 variants × 16 requests, all submitted at once, 16 slots
    let systems: Vec<Vec<i32>> = (0..8).map(|v| prompt(100 + v, 60)).collect();
    let mut s = split_sched(16, 128, 128);
    let mut f = Fake::split(16, 128);
    let mut all = vec![];
    for r in 0..16 {
        for (v, sys) in systems.iter().enumerate() {
            let p = with_system(sys, &[2 + r, 3 + v as i32]);
            all.push((p.clone(), submit(&mut s, p, 4, &format!("v{v}"))));
        }
    }
    run(&mut s, &mut f);
    for (p, rx) in all.iter_mut() {
        assert_eq!(drain(rx).0, solo(p, 4));
    }
    // a system prompt's last position is computed as part of a chunk; count whole prompts:
    // computed prompt tokens ≤ 2 × 8 × 60 (each prefix at most twice) + 128 × 2 (the tails)
    let computed = s.stats.prompt_tokens_computed.load(Ordering::Relaxed) as usize;
    assert!(computed <= 2 * 8 * 60 + 128 * 2, "computed {computed} prompt tokens");
    assert_eq!(f.no_slot, 0);
}

#[test]
fn a_decode_batch_of_contiguous_slots_is_one_micro_batch() {
    let mut s = split_sched(8, 64, 64);
    let mut f = Fake::split(8, 64);
    let _rxs: Vec<_> = (0..8).map(|i| submit(&mut s, prompt(i, 2 + i as usize % 3), 20, "g")).collect();
    // first step: 8 prefills of different lengths (one batch); later steps: 8 decodes in slot order
    s.step(&mut f);
    let before = f.ubatches;
    for _ in 0..10 {
        s.step(&mut f);
    }
    assert_eq!(f.ubatches - before, 10, "each decode step of 8 contiguous slots is one micro-batch");
    let slots: Vec<i32> = f.batch.iter().map(|b| b.2).collect();
    assert!(slots.windows(2).all(|w| w[0] < w[1]), "batch in slot order: {slots:?}");
}

#[test]
fn itl_target_holds_back_sequences_that_add_no_throughput() {
    let mut cfg = SchedulerConfig::split(16, 64, 64);
    cfg.max_itl = Some(Duration::from_millis(60));
    let mut s = Scheduler::new(cfg, Arc::new(EngineStats::default()));
    // teach the model a saturated machine: 4 ms + 6 ms per sequence
    for n in 1..=8 {
        s.steps.observe(n, Duration::from_secs_f64(0.004 + 0.006 * n as f64));
    }
    let mut f = Fake::split(16, 64);
    let _rxs: Vec<_> = (0..16).map(|i| submit(&mut s, prompt(i, 5), 50, "g")).collect();
    s.step(&mut f);
    assert_eq!(s.n_running(), 9, "9 sequences: 58 ms; a 10th only stretches every step");
    assert_eq!(s.stats.itl_held.load(Ordering::Relaxed), 7);
}

#[test]
fn a_prefix_whose_slot_was_reused_comes_back_from_the_host_store() {
    let mut cfg = SchedulerConfig::split(2, 128, 128);
    cfg.prefix_store_bytes = 4096;
    let mut s = Scheduler::new(cfg, Arc::new(EngineStats::default()));
    let mut f = Fake::split(2, 128);
    let system = prompt(42, 50);
    let mut first = submit(&mut s, with_system(&system, &[5, 6]), 4, "a");
    run(&mut s, &mut f);
    assert_eq!(drain(&mut first).0, solo(&with_system(&system, &[5, 6]), 4));
    // two unrelated requests take both slots, so the system prompt's cached slot is reused
    let mut others: Vec<_> = (0..2).map(|i| submit(&mut s, prompt(200 + i, 30), 4, "b")).collect();
    run(&mut s, &mut f);
    others.iter_mut().for_each(|rx| assert!(drain(rx).1.is_some()));
    assert!(s.cache.iter().all(|c| super::kv::common_prefix(&c.tokens, &system) < 16), "the slot copy is gone");
    let before = s.stats.prompt_tokens_computed.load(Ordering::Relaxed);
    let p = with_system(&system, &[7, 8, 9]);
    let mut again = submit(&mut s, p.clone(), 4, "a");
    run(&mut s, &mut f);
    let (toks, done) = drain(&mut again);
    assert_eq!(toks, solo(&p, 4), "a restored prefix gives the tokens of a computed one");
    assert!(done.unwrap().shared_prompt_tokens >= 50);
    assert_eq!(s.stats.prefix_restores.load(Ordering::Relaxed), 1);
    assert_eq!(s.stats.prompt_tokens_computed.load(Ordering::Relaxed) - before, 3, "only the question was computed");
    assert!(s.store.bytes <= 4096);
}

#[test]
fn new_sequences_join_the_run_of_running_slots_instead_of_scattered_cached_ones() {
    // 8 slots, every one caching a prefix after a first round; then a variant whose prefix
    // sits in one cached slot gets 3 requests and another variant 2: they must decode as one
    // run of consecutive sequence ids (one micro-batch a step), not wherever caches happen to be
    let mut cfg = SchedulerConfig::split(8, 128, 128);
    cfg.prefix_store_bytes = 1 << 20;
    let mut s = Scheduler::new(cfg, Arc::new(EngineStats::default()));
    let mut f = Fake::split(8, 128);
    let systems: Vec<Vec<i32>> = (0..4).map(|v| prompt(300 + v, 40)).collect();
    let mut first: Vec<_> = (0..8).map(|i| submit(&mut s, with_system(&systems[i % 4], &[2 + i as i32, 9]), 3 + i as u32, "w")).collect();
    run(&mut s, &mut f);
    first.iter_mut().for_each(|rx| assert!(drain(rx).1.is_some()));
    let cached: Vec<i32> = s.cache.iter().map(|c| c.slot).collect();
    assert!(s.cache.len() >= 6, "the slots cache prefixes: {cached:?}");
    let computed = s.stats.prompt_tokens_computed.load(Ordering::Relaxed);
    let decodes = f.per_decode.len();
    let mut ps = vec![];
    for (v, n) in [(3usize, 3), (1, 2)] {
        for i in 0..n {
            ps.push(with_system(&systems[v], &[60 + i, 61]));
        }
    }
    let mut rxs: Vec<_> = ps.iter().map(|p| submit(&mut s, p.clone(), 6, "w")).collect();
    s.step(&mut f);
    let mut slots: Vec<i32> = s.running.iter().map(|a| a.slot).collect();
    slots.sort_unstable();
    assert_eq!(slots.len(), 5);
    assert!(slots.windows(2).all(|w| w[1] == w[0] + 1), "running slots {slots:?} are one run");
    run(&mut s, &mut f);
    for (p, rx) in ps.iter().zip(rxs.iter_mut()) {
        let (toks, done) = drain(rx);
        assert_eq!(toks, solo(p, 6), "a copied or restored prefix gives the tokens of a computed one");
        assert!(done.unwrap().shared_prompt_tokens >= 40);
    }
    assert!(f.per_decode[decodes..].iter().all(|&n| n == 1), "one micro-batch a step: {:?}", &f.per_decode[decodes..]);
    assert_eq!(s.stats.prompt_tokens_computed.load(Ordering::Relaxed) - computed, 5 * 2, "only the questions were computed");
}
