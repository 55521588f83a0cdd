//! A variant's part in fan-outs, for the variants that cost money (models served elsewhere at a
//! price): `fanout_rate`, the share of fan-out inputs it answers, and `daily_spend_cap`, the most
//! its fan-out may spend per UTC day.
//!
//! Invariants:
//! - sampling is deterministic per (experiment seed, variant, input): the same input asked again
//!   is answered by the same variants, and each variant's inputs are a hash sample independent
//!   of the other variants' (GrowthBook's hash, version 2, as for assignment);
//! - the spend of a day is what the variant's fan-out answers cost (their model's usage at its
//!   prices), kept in the store (`fanout_spend`) so a restart does not reset it; the server
//!   admits an answer only while the day's spend, plus the most that every answer still running
//!   can cost, plus the most this one can cost stays within the cap — the cap is never passed.
//!   The most an answer can cost is counted from the variant's `max_tokens`, which a capped
//!   variant must set, and a bound on its prompt's tokens.

/// What a client reads when a variant's fan-out was refused for its cap.
pub const SPEND_CAP_HELP: &str =
    "its fan-out resumes at 00:00 UTC, or raise daily_spend_cap in the experiment's definition";

/// A variant's fan-out settings, checked: a rate in (0, 1], a cap finite and ≥ 0 with a
/// `max_tokens`.
pub(crate) fn check(
    fanout_rate: Option<f64>,
    daily_spend_cap: Option<f64>,
    max_tokens: Option<u32>,
) -> Result<(), String> {
    if let Some(r) = fanout_rate {
        if !(r > 0.0 && r <= 1.0) {
            return Err(format!("fanout_rate {r} must be in (0, 1]"));
        }
    }
    if let Some(c) = daily_spend_cap {
        if !(c.is_finite() && c >= 0.0) {
            return Err(format!(
                "daily_spend_cap {c} must be a finite amount ≥ 0 (in the currency of the model's prices)"
            ));
        }
        if max_tokens.is_none() {
            return Err(
                "daily_spend_cap needs max_tokens: the most an answer can cost is counted from it"
                    .into(),
            );
        }
    }
    Ok(())
}

/// Whether variant `variant` with `fanout_rate` answers fan-out input `input` of an experiment
/// hashed by `seed`: always without a rate, else when the input's hash under the variant falls
/// below the rate (`Variant::fans_out`).
pub(crate) fn sampled(seed: &str, variant: &str, fanout_rate: Option<f64>, input: &str) -> bool {
    match fanout_rate {
        None => true,
        Some(rate) => abserve_statistics::hash(&format!("{seed}/fanout/{variant}/"), input, 2)
            .is_some_and(|h| h < rate),
    }
}

/// The UTC day of `t` as `YYYY-MM-DD`: the period of a daily spend cap.
pub fn utc_day(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    time::OffsetDateTime::from_unix_timestamp(secs)
        .map(|d| d.date().to_string())
        .unwrap_or_else(|_| "1970-01-01".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::Variant;

    fn check(v: &Variant) -> Result<(), String> {
        super::check(v.fanout_rate, v.daily_spend_cap, v.max_tokens)
    }

    fn variant(extra: &str) -> Variant {
        toml::from_str(&format!("id = \"paid\"\n{extra}")).unwrap()
    }

    #[test]
    fn a_rate_samples_that_share_of_inputs_and_the_same_input_always_alike() {
        let v = variant("fanout_rate = 0.25");
        let inputs: Vec<String> = (0..4000).map(|i| format!("question {i}")).collect();
        let picked: Vec<bool> = inputs.iter().map(|i| v.fans_out("exp", i)).collect();
        let share = picked.iter().filter(|&&b| b).count() as f64 / inputs.len() as f64;
        // binomial sd at n = 4000, p = 0.25: 0.0068; 4 sd
        assert!((share - 0.25).abs() < 0.028, "share {share}");
        for (i, p) in inputs.iter().zip(&picked) {
            assert_eq!(v.fans_out("exp", i), *p);
        }
        // another variant with the same rate samples other inputs
        let w: Variant = toml::from_str("id = \"other\"\nfanout_rate = 0.25").unwrap();
        let same = inputs
            .iter()
            .zip(&picked)
            .filter(|(i, &p)| w.fans_out("exp", i) == p)
            .count();
        assert!(same < inputs.len() * 9 / 10, "{same} of {}", inputs.len());
        assert!(inputs.iter().all(|i| variant("").fans_out("exp", i)));
    }

    #[test]
    fn rates_and_caps_out_of_range_are_refused_by_name() {
        for bad in [
            "fanout_rate = 0.0",
            "fanout_rate = 1.5",
            "daily_spend_cap = -1.0\nmax_tokens = 8",
            "daily_spend_cap = 1.0",
        ] {
            let e = check(&variant(bad)).unwrap_err();
            assert!(e.contains(bad.split(' ').next().unwrap()), "{e}");
        }
        let ok = "fanout_rate = 1.0\ndaily_spend_cap = 0.0\nmax_tokens = 8";
        assert!(check(&variant(ok)).is_ok());
    }

    #[test]
    fn the_day_is_utc() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_601_599);
        assert_eq!(utc_day(t), "2026-12-06");
        assert_eq!(utc_day(t + std::time::Duration::from_secs(1)), "2026-12-07");
    }
}
