//! Token sampling in Rust, one [`Sampler`] per sequence.
//!
//! Sampling lives here rather than in llama.cpp's sampler chain so that every sequence owns a
//! seeded ChaCha stream: the same request with the same seed draws the same random numbers
//! whatever else runs in the batch, and a preempted sequence keeps its stream when it is
//! recomputed. The order of the transforms follows vLLM/OpenAI: penalties, logit bias, the
//! grammar's mask (a constrained sequence: disallowed tokens get −∞), temperature, top-k, top-p,
//! min-p, then a draw.
//!
//! Log-probabilities are those of the model's distribution after the penalties and before the
//! logit bias and the mask: a token the grammar forces reports what the model gave it, not 0.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use toktrie::SimpleVob;

/// How llama.cpp's server defaults the repetition window.
pub const PENALTY_LAST_N: usize = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    /// llama.cpp-style repetition penalty (1.0 disables).
    pub repetition_penalty: f32,
    /// OpenAI-style penalties in [-2, 2].
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub seed: Option<u64>,
    pub max_tokens: u32,
    pub stop: Vec<String>,
    /// Return the log-probability of each sampled token and this many alternatives.
    pub logprobs: Option<u32>,
    /// Keep generating past end-of-generation tokens (benchmarks).
    pub ignore_eos: bool,
    /// Take the prompt's prefix from the cache of finished requests when it is there
    /// (llama.cpp's `cache_prompt`). Default: yes, unless `seed` is set — logits computed from a
    /// cached prefix are not bit-identical to a full prefill, so a seeded request computes its
    /// prompt to give the same text every time.
    pub cache_prompt: Option<bool>,
    /// OpenAI's `logit_bias`: added to a token's logit before sampling (−100 bans it in
    /// practice, +100 all but forces it).
    pub logit_bias: Vec<(i32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: None,
            max_tokens: 16,
            stop: Vec::new(),
            logprobs: None,
            ignore_eos: false,
            cache_prompt: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Whether this request may take its prefix from finished requests' cached KV.
    pub fn uses_prompt_cache(&self) -> bool {
        self.cache_prompt.unwrap_or(self.seed.is_none())
    }

    pub fn greedy(max_tokens: u32) -> Self {
        SamplingParams {
            temperature: 0.0,
            max_tokens,
            ..Default::default()
        }
    }

    /// Range checks with the parameter's name, for a clear 400 upstream.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let f =
            |ok: bool, name: &'static str, msg: String| if ok { Ok(()) } else { Err((name, msg)) };
        f(
            self.temperature.is_finite() && (0.0..=2.0).contains(&self.temperature),
            "temperature",
            format!(
                "temperature must be between 0 and 2, got {}",
                self.temperature
            ),
        )?;
        f(
            self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0,
            "top_p",
            format!("top_p must be in (0, 1], got {}", self.top_p),
        )?;
        f(
            self.min_p.is_finite() && (0.0..=1.0).contains(&self.min_p),
            "min_p",
            format!("min_p must be in [0, 1], got {}", self.min_p),
        )?;
        f(
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "repetition_penalty",
            format!(
                "repetition_penalty must be > 0, got {}",
                self.repetition_penalty
            ),
        )?;
        f(
            self.frequency_penalty.is_finite() && (-2.0..=2.0).contains(&self.frequency_penalty),
            "frequency_penalty",
            format!(
                "frequency_penalty must be between -2 and 2, got {}",
                self.frequency_penalty
            ),
        )?;
        f(
            self.presence_penalty.is_finite() && (-2.0..=2.0).contains(&self.presence_penalty),
            "presence_penalty",
            format!(
                "presence_penalty must be between -2 and 2, got {}",
                self.presence_penalty
            ),
        )?;
        f(
            self.max_tokens >= 1,
            "max_tokens",
            format!("max_tokens must be at least 1, got {}", self.max_tokens),
        )?;
        f(
            self.logprobs.is_none_or(|n| n <= 20),
            "top_logprobs",
            "top_logprobs must be between 0 and 20".to_string(),
        )?;
        f(
            self.stop.len() <= 16,
            "stop",
            "at most 16 stop sequences".to_string(),
        )?;
        f(
            self.stop.iter().all(|s| !s.is_empty()),
            "stop",
            "stop sequences must not be empty".into(),
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: i32,
    pub logprob: f32,
    pub top: Vec<(i32, f32)>,
}

pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    /// Counts of each generated token (frequency/presence penalties).
    counts: std::collections::HashMap<i32, u32>,
    scratch: Vec<(i32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let rng = match params.seed {
            Some(s) => ChaCha20Rng::seed_from_u64(s),
            None => ChaCha20Rng::from_entropy(),
        };
        Sampler {
            params,
            rng,
            counts: Default::default(),
            scratch: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Records a token the sequence produced (penalties count generated tokens).
    pub fn accept(&mut self, token: i32) {
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// Picks the next token from `logits`. `recent` holds the last tokens of the sequence
    /// (prompt and output) for the repetition penalty; `allowed`, a constrained sequence's
    /// grammar mask (at least one token of the vocabulary allowed).
    pub fn sample(
        &mut self,
        logits: &[f32],
        recent: &[i32],
        allowed: Option<&SimpleVob>,
    ) -> (i32, Option<TokenLogprob>) {
        let mut owned;
        let logits: &[f32] = if self.penalised() {
            owned = logits.to_vec();
            self.penalise(&mut owned, recent);
            &owned
        } else {
            logits
        };
        let mut shaped;
        let chosen_from: &[f32] = if !self.params.logit_bias.is_empty() || allowed.is_some() {
            shaped = logits.to_vec();
            for &(t, b) in &self.params.logit_bias {
                if let Some(l) = shaped.get_mut(t as usize) {
                    *l += b;
                }
            }
            if let Some(mask) = allowed {
                for (t, l) in shaped.iter_mut().enumerate() {
                    if !mask.is_allowed(t as u32) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            &shaped
        } else {
            logits
        };
        let token = if self.params.temperature <= 0.0 {
            argmax(chosen_from)
        } else {
            self.draw(chosen_from)
        };
        let lp = self
            .params
            .logprobs
            .map(|n| logprob_of(logits, token, n as usize));
        (token, lp)
    }

    /// The log-probability of `token` (a forced one) under `logits`, as [`Sampler::sample`]
    /// reports a sampled token's: after the penalties.
    pub fn logprob(&self, logits: &[f32], recent: &[i32], token: i32) -> Option<TokenLogprob> {
        let n = self.params.logprobs?;
        if self.penalised() {
            let mut owned = logits.to_vec();
            self.penalise(&mut owned, recent);
            return Some(logprob_of(&owned, token, n as usize));
        }
        Some(logprob_of(logits, token, n as usize))
    }

    /// Whether any penalty changes the logits (then they are copied and `penalise`d).
    fn penalised(&self) -> bool {
        let p = &self.params;
        p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0
    }

    fn penalise(&self, owned: &mut [f32], recent: &[i32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            let start = recent.len().saturating_sub(PENALTY_LAST_N);
            let mut seen = std::collections::HashSet::new();
            for &t in &recent[start..] {
                if seen.insert(t) {
                    if let Some(l) = owned.get_mut(t as usize) {
                        *l = if *l > 0.0 {
                            *l / p.repetition_penalty
                        } else {
                            *l * p.repetition_penalty
                        };
                    }
                }
            }
        }
        for (&t, &c) in &self.counts {
            if let Some(l) = owned.get_mut(t as usize) {
                *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
            }
        }
    }

    fn draw(&mut self, logits: &[f32]) -> i32 {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let cands = &mut self.scratch;
        cands.clear();
        cands.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as i32, l * inv_t)),
        );
        // tokens a grammar ruled out (−∞) are no candidates at all, whatever the rounding below
        cands.retain(|c| c.1 > f32::NEG_INFINITY);
        if cands.is_empty() {
            return argmax(logits);
        }
        if p.top_k > 0 && (p.top_k as usize) < cands.len() {
            let k = p.top_k as usize;
            cands.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
            cands.truncate(k);
        }
        let needs_sort = p.top_p < 1.0 || p.min_p > 0.0;
        if needs_sort {
            cands.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        }
        let max = cands.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let mut probs: Vec<f64> = cands.iter().map(|c| ((c.1 - max) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, &pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 && !probs.is_empty() {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&pr| pr >= floor).count().max(1));
        }
        let kept_total: f64 = probs[..keep].iter().sum();
        let u: f64 = self.rng.gen::<f64>() * kept_total;
        let mut cum = 0.0;
        for i in 0..keep {
            cum += probs[i];
            if u < cum {
                return cands[i].0;
            }
        }
        cands[keep - 1].0
    }
}

/// Index of the largest logit (lowest index wins ties, as llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best as i32
}

fn logprob_of(logits: &[f32], token: i32, n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max
        + logits
            .iter()
            .map(|&l| ((l - max) as f64).exp())
            .sum::<f64>()
            .ln() as f32;
    let mut top = Vec::new();
    if n > 0 {
        let mut idx: Vec<(i32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as i32, l))
            .collect();
        let k = n.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        idx.truncate(k);
        idx.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        top = idx.into_iter().map(|(t, l)| (t, l - lse)).collect();
    }
    TokenLogprob {
        token,
        logprob: logits[token as usize] - lse,
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        (0..100).map(|i| ((i * 37) % 100) as f32 / 10.0).collect()
    }

    #[test]
    fn greedy_is_argmax() {
        let l = logits();
        let mut s = Sampler::new(SamplingParams::greedy(4));
        assert_eq!(s.sample(&l, &[], None).0, argmax(&l));
        assert_eq!(l[argmax(&l) as usize], 9.9);
    }

    #[test]
    fn same_seed_same_draws() {
        let l = logits();
        let p = SamplingParams {
            temperature: 1.5,
            seed: Some(7),
            ..Default::default()
        };
        let a: Vec<i32> = {
            let mut s = Sampler::new(p.clone());
            (0..50).map(|_| s.sample(&l, &[], None).0).collect()
        };
        let b: Vec<i32> = {
            let mut s = Sampler::new(p.clone());
            (0..50).map(|_| s.sample(&l, &[], None).0).collect()
        };
        let c: Vec<i32> = {
            let mut s = Sampler::new(SamplingParams { seed: Some(8), ..p });
            (0..50).map(|_| s.sample(&l, &[], None).0).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_restricts() {
        let l = logits();
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 1,
            seed: Some(1),
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&l, &[], None).0, argmax(&l));
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.3,
            seed: Some(1),
            ..Default::default()
        });
        for _ in 0..50 {
            let t = s.sample(&l, &[], None).0;
            assert!(l[t as usize] >= 9.0, "top_p 0.3 picked a low token {t}");
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            min_p: 0.5,
            seed: Some(1),
            ..Default::default()
        });
        for _ in 0..50 {
            let t = s.sample(&l, &[], None).0;
            assert!(
                l[t as usize] >= 9.9 - 0.7,
                "min_p 0.5 kept a token below half the top prob"
            );
        }
    }

    #[test]
    fn penalties_move_away_from_repeats() {
        let l = logits();
        let top = argmax(&l);
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            presence_penalty: 2.0,
            ..Default::default()
        });
        s.accept(top);
        assert_ne!(s.sample(&l, &[], None).0, top);
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            repetition_penalty: 2.0,
            ..Default::default()
        });
        assert_ne!(s.sample(&l, &[top], None).0, top);
    }

    #[test]
    fn logprobs_are_normalised() {
        let l = logits();
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.0,
            logprobs: Some(5),
            ..Default::default()
        });
        let (t, lp) = s.sample(&l, &[], None);
        let lp = lp.unwrap();
        assert_eq!(lp.token, t);
        assert_eq!(lp.top.len(), 5);
        assert_eq!(lp.top[0].0, t);
        assert!(lp.logprob < 0.0);
        let total: f64 = l
            .iter()
            .map(|&x| ((x - l[t as usize] + lp.logprob) as f64).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-4);
    }

    #[test]
    fn logit_bias_moves_the_pick_and_a_mask_rules_tokens_out() {
        let l = logits();
        let top = argmax(&l);
        let other = (top + 1) % 100;
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(top, -100.0)],
            ..SamplingParams::greedy(4)
        });
        assert_ne!(s.sample(&l, &[], None).0, top, "-100 bans the argmax");
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(other, 100.0)],
            logprobs: Some(0),
            ..SamplingParams::greedy(4)
        });
        let (t, lp) = s.sample(&l, &[], None);
        assert_eq!(t, other, "+100 all but forces a token");
        // log-probabilities are the model's, before the bias
        assert!(lp.unwrap().logprob < -1.0);
        let mut allowed = SimpleVob::alloc(100);
        allowed.allow_token(7);
        allowed.allow_token(9);
        for temperature in [0.0, 1.5] {
            let mut s = Sampler::new(SamplingParams {
                temperature,
                seed: Some(3),
                ..SamplingParams::greedy(4)
            });
            for _ in 0..50 {
                let t = s.sample(&l, &[], Some(&allowed)).0;
                assert!(t == 7 || t == 9, "the mask allowed 7 and 9, got {t}");
            }
        }
    }

    #[test]
    fn validation_names_the_parameter() {
        let bad = SamplingParams {
            temperature: 3.0,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().0, "temperature");
        let bad = SamplingParams {
            max_tokens: 0,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().0, "max_tokens");
    }
}
