//! One batch per step and what happens after it: a token for every decoding sequence first,
//! then prefill chunks in admission order up to the batch capacity (so a long prompt stalls
//! running streams for at most one chunk), emitted in slot order; after the decode, new cells are
//! accounted, one token is sampled per sequence that reached its end, and finished sequences
//! leave (their prefix cached when reuse is on).
//!
//! Slot order matters with split KV streams: llama.cpp cuts such a batch into micro-batches of
//! consecutive sequence ids with equal token counts, so a batch sorted by slot, every sequence's
//! tokens together, puts all decoding sequences of a run of slots into one graph evaluation.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::seq::Phase;
use super::stats::EngineStats;
use super::{Compute, Scheduler};
use crate::request::{Completion, Event, FinishReason, GenerationError};

/// Part of a batch: `n` tokens of running sequence `idx`, with logits at batch index `logits`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Planned {
    pub idx: usize,
    pub n: usize,
    pub logits: Option<usize>,
}

impl Scheduler {
    pub(super) fn build_batch<C: Compute>(&mut self, be: &mut C) -> Vec<Planned> {
        be.clear_batch();
        let mut cap = be.batch_capacity();
        let mut plan = Vec::new();
        for phase in [Phase::Decoding, Phase::Prefilling] {
            for (idx, a) in self.running.iter().enumerate() {
                if a.phase() != phase || cap == 0 {
                    continue;
                }
                let n = a.pending().min(cap);
                plan.push(Planned {
                    idx,
                    n,
                    logits: None,
                });
                cap -= n;
            }
        }
        plan.sort_by_key(|p| self.running[p.idx].slot);
        let mut pos = 0;
        for p in &mut plan {
            let a = &self.running[p.idx];
            let reaches_end = a.n_past + p.n == a.seq.tokens.len();
            for k in 0..p.n {
                let at = a.n_past + k;
                be.add(a.seq.tokens[at], at, a.slot, reaches_end && k == p.n - 1);
            }
            pos += p.n;
            p.logits = reaches_end.then_some(pos - 1);
        }
        plan
    }

    pub(super) fn fail_batch<C: Compute>(
        &mut self,
        be: &mut C,
        plan: &[Planned],
        err: GenerationError,
    ) {
        let mut idx: Vec<usize> = plan.iter().map(|p| p.idx).collect();
        idx.sort_unstable();
        for &i in idx.iter().rev() {
            let a = self.running.remove(i);
            // release also drops the sequence from llama.cpp's cache, not only from our accounting
            let s = self.release(be, a);
            self.stats.inflight.fetch_sub(1, Ordering::Relaxed);
            let _ = s.tx.send(Event::Error(err.clone()));
        }
    }

    pub(super) fn after_decode<C: Compute>(&mut self, be: &mut C, plan: &[Planned]) {
        let mut finished = Vec::new();
        for p in plan {
            let a = &mut self.running[p.idx];
            let prompt_part = a.seq.n_prompt.saturating_sub(a.n_past).min(p.n);
            EngineStats::add(&self.stats.prompt_tokens_computed, prompt_part);
            let new = self.cells.alloc_n(p.n);
            a.cells.extend(new);
            a.n_past += p.n;
            let Some(bi) = p.logits else { continue };
            let s = &mut a.seq;
            let recent_start = s
                .tokens
                .len()
                .saturating_sub(crate::sampler::PENALTY_LAST_N);
            let (tok, logprob) = s.sampler.sample(be.logits(bi), &s.tokens[recent_start..]);
            s.sampler.accept(tok);
            s.tokens.push(tok);
            s.first_token.get_or_insert_with(Instant::now);
            self.stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
            let eog = be.is_eog(tok) && !s.sampler.params().ignore_eos;
            let mut finish = None;
            if eog {
                finish = Some(FinishReason::Stop);
                let _ = s.tx.send(Event::Token {
                    token: tok,
                    text: String::new(),
                    logprob,
                });
            } else {
                let push = s.text.push(&be.piece(tok));
                let _ = s.tx.send(Event::Token {
                    token: tok,
                    text: push.text,
                    logprob,
                });
                if push.stopped {
                    finish = Some(FinishReason::Stop);
                }
            }
            if finish.is_none() && s.tokens.len() >= s.limit {
                finish = Some(FinishReason::Length);
            }
            if let Some(f) = finish {
                finished.push((p.idx, f));
            }
        }
        finished.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        for &(i, reason) in &finished {
            let a = self.running.remove(i);
            let mut s = if self.caching() {
                self.keep_prefix(be, a)
            } else {
                self.release(be, a)
            };
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
}
