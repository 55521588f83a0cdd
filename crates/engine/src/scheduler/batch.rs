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

use super::sample::{self, End};
use super::seq::Phase;
use super::stats::EngineStats;
use super::{Compute, Planned, Scheduler};
use crate::request::{Completion, Event, GenerationError, GrammarOutcome};

impl Scheduler {
    /// The batch of the running sequences of each lane's picked adapter set (`pick[lane]`;
    /// `None`: the lane decodes nothing), up to the batch capacity of each lane — in a step that
    /// computes a sequence's first token, only those of its class and more urgent ones
    /// (`classes.rs`).
    pub(super) fn build_batch<C: Compute>(
        &mut self,
        be: &mut C,
        pick: &[Option<u32>],
    ) -> Vec<Planned> {
        be.clear_batch();
        let mut cap = vec![be.batch_capacity(); pick.len()];
        let mut plan = Vec::new();
        let floor = self.first_token_class(pick);
        self.plan_drafts(be, pick, floor);
        for phase in [Phase::Decoding, Phase::Prefilling] {
            for idx in 0..self.running.len() {
                let a = &mut self.running[idx];
                let lane = self.lanes.lane_of(a.slot);
                if a.phase() != phase
                    || pick[lane] != Some(a.seq.adapters)
                    || cap[lane] == 0
                    || a.sits_out(floor)
                {
                    continue;
                }
                let n = a.pending().min(cap[lane]);
                // drafts only where the whole pending part fits, in what capacity is left
                let room = if n == a.pending() { cap[lane] - n } else { 0 };
                a.draft.truncate(room);
                plan.push(Planned {
                    idx,
                    n: n + a.draft.len(),
                    first: 0,
                    logits: None,
                    draft: a.draft.len(),
                });
                cap[lane] -= n + a.draft.len();
            }
        }
        plan.sort_by_key(|p| self.running[p.idx].slot);
        let mut pos = 0;
        for p in &mut plan {
            let a = &self.running[p.idx];
            let len = a.seq.tokens.len();
            let own = p.n - p.draft;
            let reaches_end = a.n_past + own == len;
            // the positions whose logits give forced tokens their log-probabilities
            let forced_rows = if a.seq.sampler.params().logprobs.is_some() {
                len - a.seq.unemitted - 1..len - 1
            } else {
                0..0
            };
            for k in 0..own {
                let at = a.n_past + k;
                let last = reaches_end && k == own - 1;
                be.add(
                    a.seq.tokens[at],
                    at,
                    a.slot,
                    last || forced_rows.contains(&at),
                );
            }
            // draft tokens follow the pending one, each with logits to verify the next
            for (k, &t) in a.draft.iter().enumerate() {
                be.add(t, len + k, a.slot, true);
            }
            p.first = pos;
            pos += p.n;
            p.logits = reaches_end.then_some(pos - 1 - p.draft);
        }
        plan
    }

    /// One planned sequence after the decode: its new cells accounted, forced tokens emitted,
    /// its next tokens sampled (and drafts verified); how it ends, if it does.
    fn advance<C: Compute>(&mut self, be: &mut C, p: &Planned) -> Option<sample::End> {
        let a = &mut self.running[p.idx];
        let start = a.n_past;
        let prompt_part = a.seq.n_prompt.saturating_sub(a.n_past).min(p.n);
        EngineStats::add(&self.stats.prompt_tokens_computed, prompt_part);
        EngineStats::add(&self.stats.draft_tokens, p.draft);
        let new = self.cells.alloc_n(p.n);
        a.cells.extend(new);
        a.n_past += p.n;
        let mut end = sample::emit_forced(&mut a.seq, be, start, p);
        // positions whose KV stays: what the sequence holds, and of the drafts only those
        // accepted (the token sampled after them is computed next step)
        let mut keep = usize::MAX;
        if end.is_none() {
            if let Some(bi) = p.logits {
                let ff = self.cfg.fast_forward;
                let (e, accepted) = sample::verify(&mut a.seq, &a.draft, be, bi, ff, &self.stats);
                end = e;
                keep = start + p.n - p.draft + accepted;
                if a.seq.acceptance.by_model {
                    EngineStats::add(&self.stats.draft_model_tokens, p.draft);
                    EngineStats::add(&self.stats.draft_model_accepted, accepted);
                }
            }
        }
        a.draft.clear();
        let keep = keep.min(a.seq.tokens.len());
        if a.n_past > keep {
            // rejected drafts, or a stop string inside forced tokens: the KV past it goes
            be.truncate_seq(a.slot, keep);
            self.cells.release(&a.cells[keep..]);
            a.cells.truncate(keep);
            a.n_past = keep;
        }
        end
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
            let s = self.release(be, a).ended();
            let _ = s.tx.send(Event::Error(err.clone()));
        }
    }

    pub(super) fn after_decode<C: Compute>(&mut self, be: &mut C, plan: &[Planned]) {
        let mut finished = Vec::new();
        for p in plan {
            if let Some(end) = self.advance(be, p) {
                finished.push((p.idx, end));
            }
        }
        finished.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        for (i, end) in finished {
            let a = self.running.remove(i);
            let reason = match end {
                End::Finish(reason) => reason,
                End::Fail(e) => {
                    let s = self.release(be, a).ended();
                    let _ = s.tx.send(Event::Error(e));
                    continue;
                }
            };
            let mut s = if self.caching() {
                self.keep_prefix(be, a)
            } else {
                self.release(be, a)
            }
            .ended();
            self.stats.count_set(
                self.sets[s.adapters as usize].label(),
                s.n_prompt,
                s.generated(),
            );
            let now = Instant::now();
            let admitted = s.admitted.unwrap_or(s.arrived);
            let grammar = s.constraint.as_mut().map(|c| GrammarOutcome {
                kind: c.kind(),
                complete: c.is_stopped() || c.is_accepting(),
                forced_tokens: s.forced,
            });
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
                grammar,
                // a model of this process has no price
                cost: None,
            };
            let _ = s.tx.send(Event::Done(done));
            self.stats.completed.fetch_add(1, Ordering::Relaxed);
        }
    }
}
