//! A running sequence after its chunk of a batch was decoded: the forced tokens whose logits
//! came in are emitted, then — when the chunk reached the sequence's end — the next token is
//! sampled (under the grammar's mask for a constrained sequence), committed to the grammar, and
//! followed by the tokens the grammar forces (fast-forward).
//!
//! Forced tokens (llguidance's fast-forward tokens) are appended to the sequence without
//! sampling and computed in the next batch like a prefill chunk. They are emitted once the
//! position before each was decoded, with the log-probability its logits give (requested for
//! those positions in `batch.rs`), so streaming, usage and log-probabilities are what decoding
//! them one at a time would give. A sequence holds at most one token fewer than its limit
//! after forcing, so its forced tokens are always computed and emitted before it ends; a grammar
//! that is complete after its forced tokens ends the sequence (`stop`) at the next logits.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::seq::Seq;
use super::stats::EngineStats;
use super::Compute;
use super::Planned;
use crate::request::{Event, FinishReason, GenerationError};
use crate::sampler::PENALTY_LAST_N;

/// How a sequence ends after this step, if it does.
pub(super) enum End {
    Finish(FinishReason),
    Fail(GenerationError),
}

fn recent(tokens: &[i32], upto: usize) -> &[i32] {
    &tokens[upto.saturating_sub(PENALTY_LAST_N)..upto]
}

/// Emits the forced tokens whose preceding position was decoded in this chunk (positions
/// `[start, start + p.n)`), in order. A stop string completed by a forced token ends the
/// sequence there.
pub(super) fn emit_forced<C: Compute>(
    s: &mut Seq,
    be: &C,
    start: usize,
    p: &Planned,
) -> Option<End> {
    while s.unemitted > 0 {
        let k = s.tokens.len() - s.unemitted;
        let before = k - 1;
        if before >= start + p.n {
            break;
        }
        let tok = s.tokens[k];
        let logprob = if before >= start && s.sampler.params().logprobs.is_some() {
            let row = be.logits(p.first + (before - start));
            s.sampler.logprob(row, recent(&s.tokens, k), tok)
        } else {
            None
        };
        s.unemitted -= 1;
        let push = s.text.push(&be.piece(tok));
        let _ = s.tx.send(Event::Token {
            token: tok,
            text: push.text,
            logprob,
        });
        if push.stopped {
            // what follows the stop string is dropped, as it would never have been generated
            s.tokens.truncate(k + 1);
            s.unemitted = 0;
            return Some(End::Finish(FinishReason::Stop));
        }
    }
    None
}

/// Samples the sequence's next token from the logits at batch index `bi`.
pub(super) fn next<C: Compute>(
    s: &mut Seq,
    be: &C,
    bi: usize,
    fast_forward: bool,
    stats: &EngineStats,
) -> Option<End> {
    if s.constraint.as_ref().is_some_and(|c| c.is_stopped()) {
        // the grammar ended with the forced tokens just emitted
        return Some(End::Finish(FinishReason::Stop));
    }
    let mask = match s.constraint.as_mut() {
        None => None,
        Some(c) => {
            let t0 = Instant::now();
            let m = c.mask();
            EngineStats::add(&stats.grammar_masks, 1);
            EngineStats::add(
                &stats.grammar_mask_micros,
                t0.elapsed().as_micros() as usize,
            );
            match m {
                Ok(m) => Some(m),
                Err(e) => return Some(grammar_failed(stats, e)),
            }
        }
    };
    let n = s.tokens.len();
    let (tok, logprob) = s
        .sampler
        .sample(be.logits(bi), recent(&s.tokens, n), mask.as_ref());
    s.sampler.accept(tok);
    s.tokens.push(tok);
    s.first_token.get_or_insert_with(Instant::now);
    stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
    if s.constraint.is_some() {
        EngineStats::add(&stats.constrained_tokens, 1);
    }
    if be.is_eog(tok) && !s.sampler.params().ignore_eos {
        let _ = s.tx.send(Event::Token {
            token: tok,
            text: String::new(),
            logprob,
        });
        return Some(End::Finish(FinishReason::Stop));
    }
    if let Some(c) = s.constraint.as_mut() {
        if let Err(e) = c.commit(tok) {
            return Some(grammar_failed(stats, e));
        }
    }
    let push = s.text.push(&be.piece(tok));
    let _ = s.tx.send(Event::Token {
        token: tok,
        text: push.text,
        logprob,
    });
    if push.stopped || s.constraint.as_ref().is_some_and(|c| c.is_stopped()) {
        return Some(End::Finish(FinishReason::Stop));
    }
    if fast_forward {
        force(s, stats);
    }
    (s.tokens.len() >= s.limit).then_some(End::Finish(FinishReason::Length))
}

/// Samples the sequence's next tokens from the logits at batch index `bi` and, for each draft
/// token, the row after: on while each sample equals the draft token before it
/// (`speculate.rs`). Returns how it ends, if it does, and how many draft tokens were accepted.
/// With no draft, the sampled token is compared with the draft it would have had (`shadow`).
pub(super) fn verify<C: Compute>(
    s: &mut Seq,
    draft: &[i32],
    be: &C,
    bi: usize,
    fast_forward: bool,
    stats: &EngineStats,
) -> (Option<End>, usize) {
    let shadow = s.acceptance.shadow.take();
    let mut accepted = 0;
    loop {
        let at = s.tokens.len();
        if let Some(end) = next(s, be, bi + accepted, fast_forward, stats) {
            return (Some(end), accepted);
        }
        let sampled = s.tokens[at];
        if draft.is_empty() {
            if let Some(x) = shadow {
                s.acceptance.observe(sampled == x);
            }
            return (None, 0);
        }
        // forced tokens appended after it: the drafts no longer line up with the positions
        if accepted == draft.len() || s.unemitted > 0 {
            return (None, accepted);
        }
        let hit = sampled == draft[accepted];
        s.acceptance.observe(hit);
        if !hit {
            return (None, accepted);
        }
        accepted += 1;
        stats.draft_accepted.fetch_add(1, Ordering::Relaxed);
    }
}

/// Appends the tokens the grammar forces, leaving room for one more token below the limit.
fn force(s: &mut Seq, stats: &EngineStats) {
    let room = s.limit.saturating_sub(s.tokens.len() + 1);
    let Some(c) = s.constraint.as_mut() else {
        return;
    };
    let forced = c.forced(room);
    if forced.is_empty() {
        return;
    }
    for &t in &forced {
        s.sampler.accept(t);
    }
    EngineStats::add(&stats.forced_tokens, forced.len());
    EngineStats::add(&stats.constrained_tokens, forced.len());
    stats
        .generated_tokens
        .fetch_add(forced.len() as u64, Ordering::Relaxed);
    s.unemitted += forced.len();
    s.forced += forced.len();
    s.tokens.extend(forced);
}

fn grammar_failed(stats: &EngineStats, e: String) -> End {
    stats.grammar.rejections.fetch_add(1, Ordering::Relaxed);
    End::Fail(GenerationError::Grammar(e))
}
