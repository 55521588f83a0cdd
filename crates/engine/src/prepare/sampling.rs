//! [`Sampling`] (as sent, wide types) to the engine's [`SamplingParams`], with one limit per
//! parameter: the ranges of OpenAI's API (temperature 0–2, top_p in (0, 1], penalties −2–2),
//! `max_tokens` ≥ 1, at most [`MAX_STOP`] non-empty stop strings, top_k 0–100000.

use abserve_protocol::Sampling;

use crate::invalid::PrepareError;
use crate::sampler::SamplingParams;

pub const MAX_STOP: usize = 4;
pub const MAX_TOP_K: i64 = 100_000;

/// What a caller adds to the request's [`Sampling`]: the defaults of its endpoint and the
/// options that are not sampling settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// `max_tokens` when the request and its variant leave it unset (clamped to the room the
    /// context leaves, see [`super::fit_context`]).
    pub default_max_tokens: u32,
    /// The name a `max_tokens` error gives the field (`max_completion_tokens` when the request
    /// used OpenAI's newer name).
    pub max_tokens_field: &'static str,
    /// Log-probabilities with this many alternatives.
    pub logprobs: Option<u32>,
    pub ignore_eos: bool,
    pub cache_prompt: Option<bool>,
}

impl Options {
    pub fn new(default_max_tokens: u32) -> Self {
        Options {
            default_max_tokens,
            max_tokens_field: "max_tokens",
            logprobs: None,
            ignore_eos: false,
            cache_prompt: None,
        }
    }
}

/// The engine's parameters for `s`, every value range-checked.
pub fn sampling_params(s: &Sampling, o: &Options) -> Result<SamplingParams, PrepareError> {
    let max_tokens = match s.max_tokens {
        None => o.default_max_tokens,
        Some(m) if m >= 1 && m <= u32::MAX as i64 => m as u32,
        Some(m) => {
            let p = o.max_tokens_field;
            return Err(
                PrepareError::new(p, format!("{p} must be at least 1, got {m}"))
                    .beyond("at least 1", m),
            );
        }
    };
    let stop = s.stop.as_ref().map(|s| s.to_vec()).unwrap_or_default();
    if stop.len() > MAX_STOP {
        return Err(PrepareError::new(
            "stop",
            format!("stop may hold at most {MAX_STOP} sequences"),
        )
        .beyond(MAX_STOP, stop.len()));
    }
    if stop.iter().any(|s| s.is_empty()) {
        return Err(PrepareError::new(
            "stop",
            "stop sequences must not be empty",
        ));
    }
    let top_k = match s.top_k {
        None => 0,
        Some(k) if (0..=MAX_TOP_K).contains(&k) => k as u32,
        Some(k) => {
            return Err(PrepareError::new(
                "top_k",
                format!("top_k must be between 0 and {MAX_TOP_K}, got {k}"),
            )
            .beyond(format!("0 to {MAX_TOP_K}"), k))
        }
    };
    let d = SamplingParams::default();
    let f = |v: Option<f64>, default: f32| v.map_or(default, |x| x as f32);
    let p = SamplingParams {
        temperature: f(s.temperature, d.temperature),
        top_k,
        top_p: f(s.top_p, d.top_p),
        min_p: f(s.min_p, d.min_p),
        repetition_penalty: f(s.repetition_penalty, d.repetition_penalty),
        frequency_penalty: f(s.frequency_penalty, d.frequency_penalty),
        presence_penalty: f(s.presence_penalty, d.presence_penalty),
        // OpenAI's seed is signed; a negative one keeps its bits
        seed: s.seed.map(|x| x as u64),
        max_tokens,
        stop,
        logprobs: o.logprobs,
        ignore_eos: o.ignore_eos,
        cache_prompt: o.cache_prompt,
        // checked against the vocabulary by the preparation stage (`structure.rs`)
        logit_bias: Vec::new(),
    };
    p.validate()
        .map_err(|(field, msg)| PrepareError::new(field, msg))?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use abserve_protocol::wire::Stop;

    #[test]
    fn unset_values_take_the_defaults_and_set_ones_are_checked() {
        let p = sampling_params(&Sampling::default(), &Options::new(7)).unwrap();
        assert_eq!(p.max_tokens, 7);
        assert_eq!(p.temperature, 1.0);
        let s = Sampling {
            temperature: Some(0.7),
            seed: Some(-1),
            stop: Some(Stop::One("x".into())),
            ..Default::default()
        };
        let p = sampling_params(&s, &Options::new(7)).unwrap();
        assert_eq!(
            (p.temperature, p.seed, p.stop),
            (0.7, Some(u64::MAX), vec!["x".into()])
        );
        let bad = |s: Sampling| sampling_params(&s, &Options::new(7)).unwrap_err();
        let e = bad(Sampling {
            temperature: Some(2.5),
            ..Default::default()
        });
        assert_eq!(e.field, "temperature");
        let e = bad(Sampling {
            max_tokens: Some(0),
            ..Default::default()
        });
        assert_eq!(
            (e.field.as_str(), e.value.as_deref()),
            ("max_tokens", Some("0"))
        );
        let e = bad(Sampling {
            stop: Some(Stop::Many(vec!["a".into(); 5])),
            ..Default::default()
        });
        assert_eq!(
            (e.limit.as_deref(), e.value.as_deref()),
            (Some("4"), Some("5"))
        );
    }
}
