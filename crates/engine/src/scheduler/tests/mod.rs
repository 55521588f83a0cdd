//! Scheduler tests on a fake model whose next token is a hash of every token the sequence has
//! in the KV cache, so a wrong shared prefix, a wrong copy or a wrong recompute changes the
//! output. The fake keeps llama.cpp's two KV layouts: one unified pool, or one fixed stream per
//! sequence id where a prefix can only be given by copying a whole stream. `unified.rs` tests
//! the unified pool, `split.rs` the split streams (the default), `gang.rs` group submissions,
//! `classes.rs` priority classes, `grammar.rs` constrained sequences (masks, forced tokens),
//! `speculate.rs` prompt-lookup drafts.

mod adapters;
mod classes;
mod gang;
mod grammar;
mod speculate;
mod split;
mod unified;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::*;
use crate::request::{Completion, Event, FinishReason, Request};
use crate::sampler::SamplingParams;
use std::sync::atomic::Ordering;
use std::time::Duration;

const VOCAB: usize = 128;
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
    /// Each token's text (`None`: `<id>`); the grammar tests use a JSON vocabulary.
    pieces: Option<Vec<Vec<u8>>>,
    /// The adapter set applied (0: the base model, else a tag of its label): a position
    /// computed under it holds `token ^ tag << 16`, so KV computed under another set changes
    /// every later token, as a LoRA adapter changes the keys and values.
    /// One per adapter lane (`lanes`).
    adapter: Vec<i32>,
    /// Adapter sets applied, in order (each change once, in any lane).
    applied: Vec<String>,
    /// Adapter lanes (`None`: one context).
    lanes: Option<crate::lane_split::Lanes>,
    /// `Some(n)`: the next token is one of 6, from the last two tokens alone, except at every
    /// n-th position where the position changes it too — output repeats what came before, so
    /// prompt-lookup drafts are accepted, except across those positions (`None`: the next token
    /// is a hash of the whole history).
    markov: Option<usize>,
    /// A draft model (`Compute::draft`) that predicts this fake's next tokens, every n-th of
    /// its draft tokens wrong; the draft tokens it made so far.
    draft_model: Option<usize>,
    model_drafted: usize,
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
            pieces: None,
            adapter: vec![0],
            applied: vec![],
            lanes: None,
            markov: None,
            draft_model: None,
            model_drafted: 0,
        }
    }
    fn split(slots: usize, per: usize) -> Self {
        Fake {
            per_stream: Some(per),
            ..Fake::new(slots * per)
        }
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
    /// `slots` streams of `per` cells in `lanes` adapter lanes.
    fn lanes(slots: usize, per: usize, lanes: usize) -> Self {
        let l = crate::lane_split::Lanes::new(slots, lanes);
        Fake {
            adapter: vec![0; l.count()],
            lanes: Some(l),
            ..Fake::split(slots, per)
        }
    }
    fn lane(&self, seq: i32) -> usize {
        self.lanes.map_or(0, |l| l.lane_of(seq))
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
        assert!(
            v.iter().enumerate().all(|(i, (p, _))| *p == i),
            "seq {seq} has a hole in its KV"
        );
        v.into_iter().map(|x| x.1).collect()
    }
}

fn next_token(history: &[i32], eog: bool) -> i32 {
    let mut h: u64 = 1469598103934665603;
    for &t in history {
        h = (h ^ t as u64).wrapping_mul(1099511628211);
    }
    if eog && h.is_multiple_of(17) {
        EOG
    } else {
        2 + (h % (VOCAB as u64 - 2)) as i32
    }
}

/// The `markov` fake's next token after `history` (its last position `pos`).
fn markov_token(history: &[i32], pos: usize, every: usize) -> i32 {
    let mut last = history[history.len().saturating_sub(2)..].to_vec();
    if pos % every == every - 1 {
        last.push(pos as i32);
    }
    // mixed well (splitmix64's rounds): no pattern in the low bits for drafts to exploit
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for t in last {
        h ^= t as u64;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    2 + (h % 6) as i32
}

impl Compute for Fake {
    fn has_draft_model(&self) -> bool {
        self.draft_model.is_some()
    }
    fn draft_behind(&self, _slot: i32, _tokens: &[i32]) -> usize {
        1
    }
    fn draft(&mut self, asks: &[DraftAsk<'_>]) -> Result<Vec<Vec<i32>>, String> {
        let wrong = self.draft_model.ok_or("no draft model")?;
        let mut out = Vec::new();
        for a in asks {
            let mut h = a.tokens.to_vec();
            for _ in 0..a.max {
                let t = match self.markov {
                    None => next_token(&h, self.eog),
                    Some(n) => markov_token(&h, h.len() - 1, n),
                };
                self.model_drafted += 1;
                h.push(match self.model_drafted % wrong {
                    0 if t == 2 => 3,
                    0 => 2,
                    _ => t,
                });
            }
            out.push(h[a.tokens.len()..].to_vec());
        }
        Ok(out)
    }
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
            match self
                .stream(seq)
                .find(|&i| self.cells[i].is_none() && !taken.contains(&i))
            {
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
            self.cells[taken[k]] = Some(FakeCell {
                pos,
                token: token ^ (self.adapter[self.lane(seq)] << 16),
                seqs: [seq].into(),
            });
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
                let h = self.history(seq, pos);
                let t = match self.markov {
                    None => next_token(&h, self.eog),
                    Some(n) => markov_token(&h, pos, n),
                };
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
        assert!(
            self.cells.iter().flatten().all(|c| !c.seqs.contains(&dst)),
            "share into a sequence that holds cells"
        );
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
                    self.cells[j] = self.cells[i].as_ref().map(|c| FakeCell {
                        pos: c.pos,
                        token: c.token,
                        seqs: [dst].into(),
                    });
                }
                self.truncate_seq(dst, len);
            }
        }
    }
    fn save_seq(&mut self, seq: i32) -> Option<(Snapshot, usize)> {
        assert!(
            self.pending.iter().all(|p| p.1 != seq),
            "saved sequence {seq} before its copy landed"
        );
        let cells: Vec<(usize, i32)> = self
            .cells
            .iter()
            .flatten()
            .filter(|c| c.seqs.contains(&seq))
            .map(|c| (c.pos, c.token))
            .collect();
        let n = cells.len() * 8;
        Some((Box::new(cells), n))
    }
    fn restore_seq(&mut self, snap: &Snapshot, seq: i32) -> bool {
        assert!(
            self.pending.iter().all(|p| p.0 != seq),
            "restored into {seq} before the copy from it landed"
        );
        assert!(
            self.cells.iter().flatten().all(|c| !c.seqs.contains(&seq)),
            "restore into a sequence that holds cells"
        );
        let cells = snap
            .downcast_ref::<Vec<(usize, i32)>>()
            .expect("fake snapshot");
        let free: Vec<usize> = self
            .stream(seq)
            .filter(|&i| self.cells[i].is_none())
            .collect();
        if free.len() < cells.len() {
            return false;
        }
        for (k, &(pos, token)) in cells.iter().enumerate() {
            self.cells[free[k]] = Some(FakeCell {
                pos,
                token,
                seqs: [seq].into(),
            });
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
        match &self.pieces {
            Some(p) => p[token as usize].clone(),
            None => format!("<{token}>").into_bytes(),
        }
    }
    fn is_eog(&self, token: i32) -> bool {
        token == EOG
    }
    fn set_adapters(
        &mut self,
        lane: usize,
        set: &crate::adapters::AdapterSet,
    ) -> Result<(), String> {
        let tag = if set.is_base() {
            0
        } else {
            1 + (next_token(
                set.label()
                    .as_bytes()
                    .iter()
                    .map(|&b| b as i32)
                    .collect::<Vec<_>>()
                    .as_slice(),
                false,
            ) % 100)
        };
        if tag != self.adapter[lane] {
            self.adapter[lane] = tag;
            self.applied.push(set.label());
        }
        Ok(())
    }
}

fn submit(
    s: &mut Scheduler,
    prompt: Vec<i32>,
    max_tokens: u32,
    group: &str,
) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    s.enqueue_counted(
        Request {
            prompt,
            params: SamplingParams::greedy(max_tokens),
            group: Some(group.into()),
            probe: false,
            class: Default::default(),
            priority: 0,
            kv_share: None,
            constraint: None,
            adapters: Default::default(),
            lease: Default::default(),
        },
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
        assert!(
            s.used_cells() <= s.cfg.kv_cells,
            "accounting exceeded the cache"
        );
        assert_eq!(
            s.used_cells(),
            f.used(),
            "accounting disagrees with the cache"
        );
        guard += 1;
        assert!(guard < 100_000, "scheduler did not finish");
    }
}

fn sched(kv: usize, slots: usize, ctx: usize) -> Scheduler {
    Scheduler::new(
        SchedulerConfig::new(kv, slots, ctx),
        Arc::new(EngineStats::default()),
    )
}

fn prompt(seed: i32, len: usize) -> Vec<i32> {
    (0..len as i32)
        .map(|i| 2 + (seed * 31 + i * 7).rem_euclid(90))
        .collect()
}

fn solo(p: &[i32], max_tokens: u32) -> Vec<i32> {
    let mut s = sched(4096, 4, 1024);
    let mut f = Fake::new(4096);
    let mut rx = submit(&mut s, p.to_vec(), max_tokens, "solo");
    run(&mut s, &mut f);
    drain(&mut rx).0
}
