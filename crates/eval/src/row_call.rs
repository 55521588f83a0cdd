//! One row × variant: the call a variant makes for a row ([`call_for`]), its result row before
//! the answer ([`blank`]), and the answer recorded and scored ([`record`]) — the same whether
//! the answer came from a target asked directly (`runner`) or from a worker (`queued`).

use std::collections::BTreeMap;

use abserve_ab::{Variant, VariantError};
use serde_json::Value;

use crate::config::{EvalConfig, ScorerKind};
use crate::dataset::Row;
use crate::results::ResultRow;
use crate::scorers;
use crate::target::{Call, Generation, DEFAULT_MAX_TOKENS};

/// The chat request of `v` for `row`. Without a variant seed, all variants of a row share one
/// (derived from the row's id): sampled variants then differ by their prompts, not by luck.
pub fn call_for(v: &Variant, row: &Row) -> Result<Call, VariantError> {
    let messages = v.chat_for_row(&Value::Object(row.fields.clone()))?;
    let mut sampling = v.sampling();
    sampling.max_tokens = sampling.max_tokens.or(Some(i64::from(DEFAULT_MAX_TOKENS)));
    sampling.seed = sampling
        .seed
        .or_else(|| Some((crate::dataset::fnv1a(row.id.bytes()) >> 1) as i64));
    Ok(Call {
        messages,
        sampling,
        structure: v.structure(),
        model: v.model.clone(),
    })
}

/// A result row for `v` on `row`, before the answer.
pub(crate) fn blank(row: &Row, v: &Variant) -> ResultRow {
    ResultRow {
        row: row.id.clone(),
        line: row.line,
        variant: v.id.clone(),
        input: row.input().to_string(),
        expected: row.expected(),
        output: None,
        prompt_tokens: 0,
        completion_tokens: 0,
        ttft_ms: None,
        latency_ms: None,
        finish_reason: None,
        scores: BTreeMap::new(),
        score_errors: BTreeMap::new(),
        error: None,
        attempts: 0,
    }
}

/// Fills in an answer (scored) or its error.
pub(crate) async fn record(
    cfg: &EvalConfig,
    row: &Row,
    r: &mut ResultRow,
    answer: Result<Generation, String>,
    attempts: u32,
) {
    r.attempts = attempts;
    match answer {
        Ok(g) => {
            r.output = Some(g.text);
            r.prompt_tokens = g.prompt_tokens;
            r.completion_tokens = g.completion_tokens;
            r.ttft_ms = Some(g.ttft.as_secs_f64() * 1e3);
            r.latency_ms = Some(g.latency.as_secs_f64() * 1e3);
            r.finish_reason = Some(g.finish_reason);
            score_all(cfg, row, r, false).await;
        }
        Err(e) => r.error = Some(e),
    }
}

pub(crate) async fn score_all(cfg: &EvalConfig, row: &Row, r: &mut ResultRow, only_missing: bool) {
    if !r.ok() {
        return;
    }
    for s in &cfg.scorers {
        if matches!(s.kind, ScorerKind::Judge { .. })
            || (only_missing
                && (r.scores.contains_key(&s.name) || r.score_errors.contains_key(&s.name)))
        {
            continue;
        }
        let v = cfg.experiment.variants.iter().find(|v| v.id == r.variant);
        match scorers::score(s, row, r, v).await {
            Ok(x) => {
                r.scores.insert(s.name.clone(), x);
            }
            Err(e) => {
                r.score_errors.insert(s.name.clone(), e.to_string());
            }
        }
    }
}
