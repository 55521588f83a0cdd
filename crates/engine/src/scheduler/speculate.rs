//! Speculative decoding by prompt lookup (n-gram drafts from the sequence's own prompt and
//! output, as llama.cpp's `ngram-simple` and vLLM's `ngram` speculators draft) and, where lookup
//! finds nothing, by a draft model (`--draft-model`: [`super::Compute::draft`], greedy, one call
//! per step for every sequence it drafts for; `llama/draft.rs`), verified in the batch that
//! decodes every other sequence. Acceptance is measured per source.
//!
//! A decoding sequence whose last n tokens (n = 4 down to 2) occurred earlier in its tokens
//! drafts the tokens that followed them there. Its pending token and its k drafts go into the
//! step's batch with logits at each position (`batch.rs`); after the decode its next tokens are
//! sampled one by one from those rows exactly as without drafts (`sample::next`: penalties,
//! grammar mask, sampler RNG), a draft counting as accepted while each sample equals it.
//!
//! Invariants:
//! - Output is what it is without speculation: greedy tokens are identical; sampled tokens are
//!   distributed as without, with the same RNG draws. For a draft that proposes one token with
//!   certainty, the rejection rule of speculative sampling (accept x with probability p(x), else
//!   sample from p with x removed) is exactly "sample from p, accept if it is x".
//! - The KV of rejected drafts is dropped in the same step (`truncate_seq`, and their cells in
//!   the scheduler's table), so accounting stays equal to what the model holds.
//! - Drafts never reach past the sequence's limit, the batch capacity or (unified cache) the
//!   free cells; a sequence with forced tokens not yet computed does not draft.
//! - Only where draft rows compute what one-token decodes would, bit for bit: not under a LoRA
//!   adapter, not without flash attention (`config.rs`); measured by the engine's reference
//!   tests against llama.cpp (`tests/reference.rs`, `tests/adapters.rs`), which part otherwise.
//!
//! When it pays ([`SpecModel`]): per sequence and per source, the measured acceptance rate of
//! its drafts (for lookup also measured while it does not draft: the draft it would have made
//! is compared with the token sampled; a new sequence starts from the recent steps' acceptance
//! of each source) sets the draft length: k drafts while the chance that all k are accepted,
//! rate^k, is at least what one more row costs against the time per token at this batch size
//! (the step-time line of `itl.rs`: slope · D / t(D); on a CPU a row costs ~40% of a lone
//! token's step and nearly a whole token's share in a full batch; step times by rows, drafts
//! included), and at least [`P_MIN`]. Per step, with D decoding sequences, drafting is used
//! while the measured tokens per second of steps with drafts beats that of steps without at the
//! same D (each re-measured every [`EXPLORE`] steps; a step's time includes the draft model's
//! calls); llama.cpp cuts a batch whose sequences have unequal token counts into more graph
//! evaluations, which this measures rather than models. A draft model that drafts for nobody
//! is measured again by one token every `MODEL_EXPLORE` steps, only for a sequence whose draft
//! context lags at most `MAX_BEHIND` tokens (catching up with a long prompt costs most of a
//! prefill through the draft), and every `MODEL_EXPLORE_ANY` steps for any sequence.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Compute, Scheduler};
use crate::request::Class;

/// Whether sequences draft (`--speculative`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Speculation {
    Off,
    /// Where the sequence's acceptance and the measured step throughput say it pays.
    #[default]
    Measured,
    /// Where the sequence's acceptance says so (against [`P_MIN`]), in every step, with no step
    /// timing deciding (a device where verifying a few more tokens costs next to nothing;
    /// tests, which must not depend on timings).
    Always,
}

/// Longest draft per sequence and step.
pub(super) const MAX_DRAFT: usize = 8;
/// Longest and shortest n-gram looked up.
const NGRAM_MAX: usize = 4;
const NGRAM_MIN: usize = 2;
/// A draft is as long as the chance that all of it is accepted stays at least this, or the
/// measured cost of a row relative to a token where that is more (`itl::StepModel::row_share`).
pub(super) const P_MIN: f64 = 0.35;
/// Prior acceptance rate of a new sequence (moved by each draft token verified).
const PRIOR: f64 = 0.5;
/// Weight of one observation in the acceptance and throughput averages.
const ALPHA: f64 = 0.1;
const RATE_ALPHA: f64 = 0.2;
/// Steps between re-measuring the mode not in use.
pub(super) const EXPLORE: u64 = 32;
/// Steps between drafts of one token by the draft model for a sequence it does not draft for
/// (to measure it by), and the most tokens that sequence's draft context may lag behind.
const MODEL_EXPLORE: u64 = 64;
const MAX_BEHIND: usize = 16;
/// Steps between such drafts for a sequence however far its draft context lags (bringing it to
/// a prompt of 2,048 tokens costs at most ~2% of these steps with a draft of half the layers).
const MODEL_EXPLORE_ANY: u64 = 1024;

/// The tokens that followed the latest earlier occurrence of the sequence's last n tokens
/// (longest n first), at most `max`.
pub(super) fn propose(tokens: &[i32], max: usize) -> Vec<i32> {
    let len = tokens.len();
    if max == 0 {
        return Vec::new();
    }
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if len <= n {
            continue;
        }
        let pattern = &tokens[len - n..];
        // latest start j < len - n whose n tokens equal the pattern
        if let Some(j) = (0..len - n).rev().find(|&j| &tokens[j..j + n] == pattern) {
            let from = j + n;
            let to = (from + max).min(len);
            if from < to {
                return tokens[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

/// One sequence's ask of the draft model ([`super::Compute::draft`]).
#[derive(Debug, Clone, Copy)]
pub struct DraftAsk<'a> {
    pub slot: i32,
    /// The sequence's tokens; the last is the one this step decodes.
    pub tokens: &'a [i32],
    pub max: usize,
}

/// Where a decoding sequence's draft would come from this step.
enum Source {
    /// What followed an earlier occurrence of its last tokens.
    Lookup(Vec<i32>),
    /// The draft model, at most this many tokens.
    Model(usize),
}

impl Scheduler {
    /// Sets the draft of each sequence this step decodes (those of the picked sets that are
    /// decoding, down to class `floor`: `batch.rs`), empty where it drafts nothing; a sequence
    /// with a lookup proposal it does not send keeps its first token as the `shadow` to measure
    /// by (the draft model's drafts are measured by drafting: `MODEL_EXPLORE`).
    /// Prompt lookup first; where it finds nothing, the draft model (one call for the step).
    pub(super) fn plan_drafts<C: Compute>(
        &mut self,
        be: &mut C,
        pick: &[Option<u32>],
        floor: Option<Class>,
    ) {
        let (decoding, proposals) = self.proposals(be.has_draft_model(), pick, floor);
        if proposals.is_empty() {
            return;
        }
        // `Always`: no step timing decides (the acceptance alone, against `P_MIN`)
        let always = self.cfg.speculative == Speculation::Always;
        let drafts = always || self.spec.drafts(decoding);
        let mut free = if self.cfg.is_unified() {
            self.cfg.kv_cells.saturating_sub(self.demand())
        } else {
            usize::MAX
        };
        // a draft token must be accepted often enough to pay for its row at this batch size
        let p_min = match always {
            true => None,
            false => self.rows.row_share(decoding),
        }
        .map_or(P_MIN, |s| s.clamp(P_MIN, 1.0));
        // where the draft model drafts for nobody, one sequence whose draft context is nearly in
        // step drafts one token now and then, to measure the model by (bringing a context to a
        // long prompt costs most of a prefill through the draft model)
        let (due, any_lag) = self.spec.model_explore_due();
        let mut explore = drafts && due;
        let max_behind = if any_lag { usize::MAX } else { MAX_BEHIND };
        let mut asks = Vec::new();
        for (idx, source) in proposals {
            let behind = match (&source, explore) {
                (Source::Model(_), true) => {
                    let a = &self.running[idx];
                    be.draft_behind(a.slot, &a.seq.tokens)
                }
                _ => usize::MAX,
            };
            let a = &mut self.running[idx];
            let available = match &source {
                Source::Lookup(p) => p.len(),
                Source::Model(max) => *max,
            };
            a.seq.acceptance.by_model = matches!(source, Source::Model(_));
            let mut k = if drafts {
                a.seq.acceptance.length(available, p_min).min(free)
            } else {
                0
            };
            if k == 0 && behind <= max_behind && free > 0 {
                (k, explore) = (1, false);
            }
            free -= k;
            match source {
                Source::Lookup(p) if k == 0 => a.seq.acceptance.shadow = Some(p[0]),
                Source::Lookup(p) => a.draft = p[..k].to_vec(),
                Source::Model(_) if k > 0 => asks.push((idx, k)),
                Source::Model(_) => {}
            }
        }
        self.ask_draft_model(be, &asks);
    }

    /// The decoding sequences this step (see `plan_drafts`) and, for those that may draft, where
    /// their draft would come from.
    fn proposals(
        &mut self,
        model: bool,
        pick: &[Option<u32>],
        floor: Option<Class>,
    ) -> (usize, Vec<(usize, Source)>) {
        let lanes = self.lanes;
        let mut decoding = 0;
        let mut proposals = Vec::new();
        for (idx, a) in self.running.iter_mut().enumerate() {
            a.draft.clear();
            a.seq.acceptance.shadow = None;
            // decoding: one position (the last sampled token) to compute
            if a.pending() != 1
                || pick[lanes.lane_of(a.slot)] != Some(a.seq.adapters)
                || a.sits_out(floor)
            {
                continue;
            }
            decoding += 1;
            // under an adapter several rows of a sequence round differently (llamafile's sgemm
            // for the F32 LoRA matrices from 4 rows): such a sequence does not draft
            if self.cfg.speculative == Speculation::Off
                || a.seq.unemitted > 0
                || !self.sets[a.seq.adapters as usize].is_base()
            {
                continue;
            }
            // the drafts and the token sampled after them stay within the limit and, with split
            // streams, within the slot's stream
            let len = a.seq.tokens.len();
            let mut room = a.seq.limit.saturating_sub(len + 1);
            if let Some(per) = self.cfg.cells_per_slot {
                room = room.min(per.saturating_sub(len));
            }
            let p = propose(&a.seq.tokens, room.min(MAX_DRAFT));
            if !p.is_empty() {
                proposals.push((idx, Source::Lookup(p)));
            } else if model && room > 0 {
                proposals.push((idx, Source::Model(room.min(MAX_DRAFT))));
            }
        }
        (decoding, proposals)
    }

    /// The draft counters before a step: draft tokens, accepted, and of those the draft model's.
    pub(super) fn draft_counters(&self) -> [u64; 4] {
        let s = &self.stats;
        [
            &s.draft_tokens,
            &s.draft_accepted,
            &s.draft_model_tokens,
            &s.draft_model_accepted,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }

    /// Tells the recent acceptance what this step's drafts achieved since `before`
    /// ([`Scheduler::draft_counters`]), prompt lookup's and the draft model's apart.
    pub(super) fn drafts_since(&mut self, before: [u64; 4]) {
        let now = self.draft_counters();
        let d: [u64; 4] = std::array::from_fn(|i| now[i] - before[i]);
        self.spec.accepted((d[0] - d[2], d[1] - d[3]), (d[2], d[3]));
    }

    /// Asks the draft model for `asks` (running index, draft length) in one call, and sets
    /// their drafts.
    fn ask_draft_model<C: Compute>(&mut self, be: &mut C, asks: &[(usize, usize)]) {
        if asks.is_empty() {
            return;
        }
        let calls: Vec<DraftAsk<'_>> = asks
            .iter()
            .map(|&(idx, k)| DraftAsk {
                slot: self.running[idx].slot,
                tokens: &self.running[idx].seq.tokens,
                max: k,
            })
            .collect();
        let got = match be.draft(&calls) {
            Ok(got) => got,
            Err(e) => {
                tracing::warn!(error = %e, "the draft model failed; this step decodes without drafts");
                return;
            }
        };
        for (&(idx, k), d) in asks.iter().zip(got) {
            let a = &mut self.running[idx];
            a.draft = d.into_iter().take(k).collect();
        }
    }
}

/// A sequence's measured draft acceptance (survives preemption with the sequence).
#[derive(Debug, Clone)]
pub(super) struct Acceptance {
    /// Moving average of "the next draft token was the sampled one", prompt lookup's drafts.
    pub rate: f64,
    /// The same for the draft model's drafts.
    pub model: f64,
    /// Whether this step's draft came from the draft model: which of the two
    /// averages `observe` and `length` use.
    pub by_model: bool,
    /// The first token of the draft proposed but not used this step (to be compared with the
    /// token sampled).
    pub shadow: Option<i32>,
}

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance {
            rate: PRIOR,
            model: PRIOR,
            by_model: false,
            shadow: None,
        }
    }
}

impl Acceptance {
    pub fn observe(&mut self, accepted: bool) {
        let x = if accepted { 1.0 } else { 0.0 };
        let rate = match self.by_model {
            true => &mut self.model,
            false => &mut self.rate,
        };
        *rate += ALPHA * (x - *rate);
    }

    /// Drafts worth sending from the source of `by_model`: while rate^k >= `p_min`, at most
    /// `available`.
    pub fn length(&self, available: usize, p_min: f64) -> usize {
        let rate = match self.by_model {
            true => self.model,
            false => self.rate,
        };
        let mut k = 0;
        let mut p = 1.0;
        while k < available.min(MAX_DRAFT) {
            p *= rate;
            if p < p_min {
                break;
            }
            k += 1;
        }
        k
    }
}

/// Measured tokens per second of decode-only steps with and without drafts, per number of
/// decoding sequences.
#[derive(Debug, Default)]
pub(super) struct SpecModel {
    by_seqs: Vec<Rates>,
    /// Acceptance of the draft tokens of recent steps, all sequences together: a new sequence
    /// starts from it (`None`: nothing drafted yet; [`PRIOR`]).
    recent: Option<f64>,
    /// The same for the draft model's draft tokens.
    recent_model: Option<f64>,
    /// Steps that asked whether a draft model exploration is due.
    model_steps: u64,
}

#[derive(Debug, Default, Clone)]
struct Rates {
    plain: Option<f64>,
    drafted: Option<f64>,
    /// Steps since each was last measured.
    since_plain: u64,
    since_drafted: u64,
}

impl SpecModel {
    fn at(&mut self, seqs: usize) -> &mut Rates {
        if self.by_seqs.len() <= seqs {
            self.by_seqs.resize(seqs + 1, Rates::default());
        }
        &mut self.by_seqs[seqs]
    }

    /// Whether a step of `seqs` decoding sequences, some of which would draft, drafts: the
    /// faster mode as measured, the other re-measured every `EXPLORE` steps (either one not yet
    /// measured first).
    pub fn drafts(&mut self, seqs: usize) -> bool {
        let r = self.at(seqs);
        match (r.plain, r.drafted) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(p), Some(d)) => {
                let best = d > p;
                let stale = if best {
                    r.since_plain >= EXPLORE
                } else {
                    r.since_drafted >= EXPLORE
                };
                best != stale
            }
        }
    }

    /// Whether a sequence the draft model does not draft for may draft one token from it this
    /// step, to measure it by (every [`MODEL_EXPLORE`] steps), and whether that sequence may
    /// lag any number of tokens (every [`MODEL_EXPLORE_ANY`] steps) rather than `MAX_BEHIND`.
    pub fn model_explore_due(&mut self) -> (bool, bool) {
        self.model_steps += 1;
        (
            self.model_steps % MODEL_EXPLORE == 1,
            self.model_steps % MODEL_EXPLORE_ANY == 1,
        )
    }

    /// A new sequence's acceptance: what recent drafts achieved.
    pub fn prior(&self) -> Acceptance {
        Acceptance {
            rate: self.recent.unwrap_or(PRIOR),
            model: self.recent_model.unwrap_or(PRIOR),
            ..Acceptance::default()
        }
    }

    /// A step's draft tokens and how many of them were accepted, by prompt lookup and by the
    /// draft model.
    pub fn accepted(&mut self, lookup: (u64, u64), model: (u64, u64)) {
        for ((drafted, accepted), recent) in
            [(lookup, &mut self.recent), (model, &mut self.recent_model)]
        {
            if drafted > 0 {
                let x = accepted as f64 / drafted as f64;
                *recent = Some(recent.map_or(x, |r| r + RATE_ALPHA * (x - r)));
            }
        }
    }

    /// A decode-only step of `seqs` sequences that emitted `tokens` in `dt`, with or without
    /// drafts.
    pub fn observe(&mut self, seqs: usize, drafted: bool, tokens: usize, dt: Duration) {
        if seqs == 0 || dt.is_zero() {
            return;
        }
        let rate = tokens as f64 / dt.as_secs_f64();
        let r = self.at(seqs);
        let (avg, since, other) = if drafted {
            (&mut r.drafted, &mut r.since_drafted, &mut r.since_plain)
        } else {
            (&mut r.plain, &mut r.since_plain, &mut r.since_drafted)
        };
        *avg = Some(avg.map_or(rate, |old| old + RATE_ALPHA * (rate - old)));
        *since = 0;
        *other += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_what_followed_the_latest_earlier_occurrence_of_the_longest_ngram() {
        // "5 6 7" occurred twice before; the latest is followed by 8 9
        let t = [5, 6, 7, 1, 2, 5, 6, 7, 8, 9, 3, 5, 6, 7];
        assert_eq!(propose(&t, 8), vec![8, 9, 3, 5, 6, 7]);
        assert_eq!(propose(&t, 2), vec![8, 9]);
        // only a bigram matches
        assert_eq!(propose(&[1, 2, 3, 9, 2, 3], 4), vec![9, 2, 3]);
        // nothing repeats
        assert!(propose(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(propose(&[5, 6, 7, 8, 5, 6], 0).is_empty());
    }

    #[test]
    fn draft_length_follows_the_measured_acceptance() {
        let mut a = Acceptance::default();
        assert_eq!(a.length(8, P_MIN), 1, "0.5, then 0.25 < P_MIN at the prior");
        for _ in 0..60 {
            a.observe(true);
        }
        assert_eq!(a.length(8, P_MIN), 8);
        assert_eq!(a.length(3, P_MIN), 3);
        // a dear row (a busy batch) asks for more: 0.9^3 = 0.73 < 0.8
        a.rate = 0.9;
        assert_eq!(a.length(8, 0.8), 2);
        for _ in 0..40 {
            a.observe(false);
        }
        assert_eq!(a.length(8, P_MIN), 0);
    }

    #[test]
    fn the_faster_mode_is_used_and_the_other_remeasured_every_explore_steps() {
        let mut m = SpecModel::default();
        let ms = Duration::from_millis;
        assert!(!m.drafts(1), "plain first");
        m.observe(1, false, 1, ms(10));
        assert!(m.drafts(1), "then drafted once");
        m.observe(1, true, 3, ms(12));
        let mut drafted = 0;
        for _ in 0..(EXPLORE * 2) {
            let d = m.drafts(1);
            drafted += d as u64;
            m.observe(1, d, if d { 3 } else { 1 }, ms(if d { 12 } else { 10 }));
        }
        assert!(drafted >= EXPLORE * 2 - 3, "drafting pays: {drafted}");
        // drafting stops paying (nothing accepted, longer steps): plain from then on
        let mut m2 = SpecModel::default();
        m2.observe(4, false, 4, ms(10));
        m2.observe(4, true, 4, ms(20));
        let drafted: u64 = (0..EXPLORE * 2)
            .map(|_| {
                let d = m2.drafts(4);
                m2.observe(4, d, 4, ms(if d { 20 } else { 10 }));
                d as u64
            })
            .sum();
        assert!(drafted <= 3, "drafted {drafted} times while it cost");
    }
}
