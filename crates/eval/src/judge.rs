//! The `judge` scorer: a model is asked which of two answers to the same input is better, the
//! variant's or control's — in both orders (the variant's answer as "A", then as "B"). A verdict
//! counts only when both orders agree ([`both_orders`]); when they disagree the judge followed
//! the position, not the answers, and the pair is `Inconsistent` (in no win rate). The report
//! gives the share of pairs whose orders agree and the share of replies that chose "A"
//! ([`position_stats`]).

use abserve_ab::render_row;
use abserve_engine::ChatMessage;
use abserve_protocol::Sampling;
use serde_json::Value;

use crate::dataset::Row;
use crate::error::ScoreError;
use crate::results::{Judgment, Verdict};
use crate::target::Call;

/// The judge's request for one pair (greedy, with the scorer's `seed`).
pub fn question(
    prompt: &str,
    row: &Row,
    (a, b): (&str, &str),
    seed: u64,
) -> Result<Call, ScoreError> {
    let mut ctx = row.fields.clone();
    ctx.insert("a".into(), Value::String(a.into()));
    ctx.insert("b".into(), Value::String(b.into()));
    let text = render_row(prompt, &Value::Object(ctx)).map_err(ScoreError::Template)?;
    Ok(Call {
        messages: vec![ChatMessage::new("user", &text)],
        sampling: Sampling {
            temperature: Some(0.0),
            max_tokens: Some(8),
            seed: Some(seed as i64),
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

/// The verdict of a pair asked in both orders: `variant_a` the reply with the variant's answer
/// as "A", `variant_b` with it as "B"; the same verdict from both, else `Inconsistent`.
pub fn both_orders(variant_a: &str, variant_b: &str) -> Verdict {
    match (verdict(variant_a, true), verdict(variant_b, false)) {
        (x, y) if x == y => x,
        _ => Verdict::Inconsistent,
    }
}

/// Over every judged pair: the share of replies that chose the answer shown first ("A"), and the
/// share of pairs asked in both orders whose verdicts agree.
pub fn position_stats<'a>(
    js: impl Iterator<Item = &'a Judgment> + Clone,
) -> (Option<f64>, Option<f64>) {
    let letters: Vec<char> = js
        .clone()
        .flat_map(|j| [j.reply.as_deref(), j.reply_swapped.as_deref()])
        .flatten()
        .filter_map(choice)
        .collect();
    let chose_first = (!letters.is_empty())
        .then(|| letters.iter().filter(|c| **c == 'A').count() as f64 / letters.len() as f64);
    let both: Vec<&Judgment> = js
        .filter(|j| j.reply_swapped.is_some() && j.verdict.is_some())
        .collect();
    let agree = both
        .iter()
        .filter(|j| j.verdict != Some(Verdict::Inconsistent))
        .count();
    let agreement = (!both.is_empty()).then(|| agree as f64 / both.len() as f64);
    (chose_first, agreement)
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
    fn verdicts_follow_the_letter_and_the_position_of_the_variant() {
        assert_eq!(verdict("A", true), Verdict::Win);
        assert_eq!(verdict("Answer B is better.", true), Verdict::Loss);
        assert_eq!(verdict("B", false), Verdict::Win);
        assert_eq!(verdict("Both are fine", false), Verdict::Tie);
        assert_eq!(choice("**A**"), Some('A'));
    }

    #[test]
    fn a_verdict_counts_only_when_both_orders_agree() {
        // a judge that always says "A" follows the position: never a verdict
        assert_eq!(both_orders("A", "A"), Verdict::Inconsistent);
        assert_eq!(both_orders("A", "B"), Verdict::Win);
        assert_eq!(both_orders("B is better", "A"), Verdict::Loss);
        assert_eq!(both_orders("same", "no idea"), Verdict::Tie);
        let j = |r: &str, s: &str| Judgment {
            row: "r".into(),
            variant: "v".into(),
            control: "c".into(),
            variant_position: "both".into(),
            reply: Some(r.into()),
            reply_swapped: Some(s.into()),
            verdict: Some(both_orders(r, s)),
            error: None,
        };
        let js = [j("A", "A"), j("A", "A"), j("A", "B"), j("B", "A")];
        let (first, agree) = position_stats(js.iter());
        assert_eq!(first, Some(6.0 / 8.0));
        assert_eq!(agree, Some(0.5));
    }
}
