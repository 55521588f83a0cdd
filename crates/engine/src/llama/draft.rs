//! The draft model of speculative decoding (`--draft-model`): a smaller model with the same
//! vocabulary (e.g. the model's first layers, self-speculation), in a llama.cpp context of its
//! own laid out as the main one (the same slots, the same cells per slot), drafting greedily for
//! the scheduler (`scheduler/speculate.rs`), which verifies the drafts in the main batch.
//!
//! Invariant: `known[slot]` is exactly the tokens whose KV the draft context holds for `slot`,
//! at positions 0..len. Before drafting for a sequence the context is brought to it through the
//! longest common prefix of `known` and the sequence's tokens (the rest removed, the missing
//! tokens decoded), so whatever happened to the slot meanwhile (another sequence, a prefix
//! copied in, a preemption, drafts rejected) costs a recompute, never a wrong draft — and a
//! draft is only ever a proposal: the main model decides every token.

use super::{Context, ContextConfig, LlamaError, Model};
use crate::plan::MemoryPlan;
use crate::scheduler::DraftAsk;

/// The draft model's context and what it holds per slot.
pub(crate) struct Drafter<'m> {
    ctx: Context<'m>,
    known: Vec<Vec<i32>>,
}

/// One ask being drafted: its slot, the drafts so far, how many it wants.
struct Drafting {
    slot: i32,
    out: Vec<i32>,
    max: usize,
}

impl<'m> Drafter<'m> {
    /// A context for `model` with the main context's layout (`plan`: the draft's own shape).
    pub fn new(
        model: &'m Model,
        plan: &MemoryPlan,
        cfg: &ContextConfig,
    ) -> Result<Self, LlamaError> {
        Ok(Drafter {
            ctx: Context::new(model, plan, cfg)?,
            known: vec![Vec::new(); plan.seq_slots as usize],
        })
    }

    /// Up to `max` greedy draft tokens per ask (see [`crate::scheduler::Compute::draft`]). A
    /// context without room for the batch (a unified cache still holding finished sequences'
    /// tokens) is emptied and the asks drafted again from nothing once.
    pub fn draft(&mut self, asks: &[DraftAsk<'_>]) -> Result<Vec<Vec<i32>>, String> {
        match self.try_draft(asks) {
            Ok(d) => Ok(d),
            Err(first) => {
                self.clear();
                self.try_draft(asks).map_err(|e| {
                    self.clear();
                    format!("{first}; again from an empty context: {e}")
                })
            }
        }
    }

    fn try_draft(&mut self, asks: &[DraftAsk<'_>]) -> Result<Vec<Vec<i32>>, String> {
        let mut d = self.catch_up(asks)?;
        self.extend(&mut d)?;
        Ok(d.into_iter().map(|d| d.out).collect())
    }

    /// How many of `tokens` a draft for `slot` would compute first (at least its last token).
    pub fn behind(&self, slot: i32, tokens: &[i32]) -> usize {
        match self.known.get(slot as usize) {
            Some(_) => tokens.len() - self.common(slot as usize, tokens),
            None => usize::MAX,
        }
    }

    /// How many of `tokens` the context holds for `slot` and keeps: their longest common prefix
    /// with what it holds, short of the last token (decoded again when held: its logits give
    /// the first draft). `slot` is one of the context's.
    fn common(&self, slot: usize, tokens: &[i32]) -> usize {
        let known = &self.known[slot];
        let common = known.iter().zip(tokens).take_while(|(k, t)| k == t).count();
        common.min(tokens.len().saturating_sub(1))
    }

    /// Drops everything the context holds (after a failure what it holds is unknown).
    fn clear(&mut self) {
        for (slot, k) in self.known.iter_mut().enumerate() {
            self.ctx.remove_seq(slot as i32);
            k.clear();
        }
    }

    /// Brings every ask's slot to its tokens (all but what the context already holds), in
    /// chunks of the batch capacity, and takes each ask's first draft from the logits of its
    /// last token.
    fn catch_up(&mut self, asks: &[DraftAsk<'_>]) -> Result<Vec<Drafting>, String> {
        let mut todo = Vec::with_capacity(asks.len());
        for a in asks {
            let (slot, tokens) = (a.slot as usize, a.tokens);
            if tokens.is_empty() || slot >= self.known.len() {
                return Err(format!(
                    "a draft asked for slot {slot} with {} tokens",
                    tokens.len()
                ));
            }
            let common = self.common(slot, tokens);
            self.ctx.truncate_seq(a.slot, common);
            self.known[slot].truncate(common);
            todo.push((a, common));
        }
        let cap = self.ctx.batch_capacity();
        let mut out: Vec<Drafting> = asks
            .iter()
            .map(|a| Drafting {
                slot: a.slot,
                out: Vec::new(),
                max: a.max,
            })
            .collect();
        let (mut next, mut at) = (0usize, todo.first().map_or(0, |t| t.1));
        while next < todo.len() {
            self.ctx.clear_batch();
            let mut rows: Vec<(usize, usize)> = Vec::new(); // (ask, batch index) of last tokens
            let mut n = 0;
            while n < cap && next < todo.len() {
                let (a, _) = todo[next];
                let take = (a.tokens.len() - at).min(cap - n);
                for pos in at..at + take {
                    let last = pos == a.tokens.len() - 1;
                    self.ctx.add(a.tokens[pos], pos, a.slot, last);
                    if last {
                        rows.push((next, n + pos - at));
                    }
                }
                self.known[a.slot as usize].extend_from_slice(&a.tokens[at..at + take]);
                n += take;
                at += take;
                if at == a.tokens.len() {
                    next += 1;
                    at = todo.get(next).map_or(0, |t| t.1);
                }
            }
            self.decode()?;
            for (ask, bi) in rows {
                out[ask].out.push(argmax(self.ctx.logits(bi)));
            }
        }
        Ok(out)
    }

    /// Decodes each ask's latest draft to draft the next, until each has what it asked for.
    fn extend(&mut self, drafting: &mut [Drafting]) -> Result<(), String> {
        loop {
            self.ctx.clear_batch();
            let mut rows = Vec::new();
            for (i, d) in drafting.iter().enumerate() {
                if d.out.len() >= d.max {
                    continue;
                }
                let known = &mut self.known[d.slot as usize];
                let last = *d.out.last().expect("catch_up drafts one token per ask");
                self.ctx.add(last, known.len(), d.slot, true);
                known.push(last);
                rows.push(i);
            }
            if rows.is_empty() {
                return Ok(());
            }
            self.decode()?;
            for (bi, i) in rows.into_iter().enumerate() {
                drafting[i].out.push(argmax(self.ctx.logits(bi)));
            }
        }
    }

    fn decode(&mut self) -> Result<(), String> {
        match self.ctx.decode()? {
            true => Ok(()),
            false => Err("the draft model's context has no room for the batch".into()),
        }
    }
}

/// The most likely token (the lowest id among equals, as llama.cpp's greedy sampler).
fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as i32
}
