//! The `judge` scorer: a model is asked which of two answers to the same input is better, the
//! variant's or control's. Which one is shown first is drawn at random per pair (seeded, so a
//! resumed run asks the same question) to cancel the judge's position bias.

use abserve_ab::render_row;
use abserve_engine::ChatMessage;
use abserve_protocol::Sampling;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::dataset::Row;
use crate::error::ScoreError;
use crate::results::Verdict;
use crate::target::Call;

/// Whether the variant's answer is shown as "A" for this pair.
pub fn variant_first(seed: u64, row: &str, variant: &str) -> bool {
    // the pair's hash mixed with the seed: stable across runs and platforms
    let h = crate::dataset::fnv1a(row.bytes().chain([0u8]).chain(variant.bytes()));
    rand_chacha::ChaCha20Rng::seed_from_u64(h ^ seed).gen_bool(0.5)
}

/// The judge's request for one pair.
pub fn question(prompt: &str, row: &Row, a: &str, b: &str) -> Result<Call, ScoreError> {
    let mut ctx = row.fields.clone();
    ctx.insert("a".into(), Value::String(a.into()));
    ctx.insert("b".into(), Value::String(b.into()));
    let text = render_row(prompt, &Value::Object(ctx)).map_err(ScoreError::Template)?;
    Ok(Call {
        messages: vec![ChatMessage::new("user", &text)],
        sampling: Sampling {
            temperature: Some(0.0),
            max_tokens: Some(8),
            seed: Some(0),
            ..Default::default()
        },
        structure: Default::default(),
        model: None,
    })
}

/// The letter the judge chose: the first standalone "A" or "B" in its reply.
pub fn choice(reply: &str) -> Option<char> {
    let re = regex::Regex::new(r"\b([AB])\b").expect("valid regex");
    re.captures(reply).and_then(|c| c[1].chars().next())
}

/// The verdict for the variant; an answer that names neither letter counts as a tie.
pub fn verdict(reply: &str, variant_is_a: bool) -> Verdict {
    match choice(reply) {
        Some('A') if variant_is_a => Verdict::Win,
        Some('B') if !variant_is_a => Verdict::Win,
        Some(_) => Verdict::Loss,
        None => Verdict::Tie,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_random_but_stable_and_verdicts_follow_the_position() {
        let firsts = (0..400)
            .filter(|i| variant_first(0, &format!("row{i}"), "b"))
            .count();
        assert!((160..240).contains(&firsts), "about half first: {firsts}");
        assert_eq!(variant_first(3, "r", "v"), variant_first(3, "r", "v"));
        assert_eq!(verdict("A", true), Verdict::Win);
        assert_eq!(verdict("Answer B is better.", true), Verdict::Loss);
        assert_eq!(verdict("B", false), Verdict::Win);
        assert_eq!(verdict("Both are fine", false), Verdict::Tie);
        assert_eq!(choice("**A**"), Some('A'));
    }
}
