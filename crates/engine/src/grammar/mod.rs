//! Constrained decoding with llguidance: a [`Grammar`] (a JSON Schema, any JSON object, a regular
//! expression or a Lark grammar) compiled by [`Grammars`] into a per-sequence [`Constraint`]
//! that the scheduler consults at every sampled token.
//!
//! Invariants:
//! - **Compiled off the engine thread**: [`Grammars::compile`] runs in the preparation stage (on
//!   the server's bounded preparation pool), within llguidance's fuel and size limits
//!   ([`limits`]) and a compile-time budget ([`COMPILE_BUDGET`]); a grammar over a limit is a
//!   [`PrepareError`] naming the field and the limit, never a stalled engine.
//! - **Every sampled token is allowed by the grammar**: the mask is applied before sampling; an
//!   end-of-generation token is allowed only where the grammar may end; every accepted token
//!   advances the matcher. A mask costs at most llguidance's per-step fuel
//!   (`step_lexer_fuel`), so a hostile grammar slows its own sequence by a bounded amount per
//!   token and no other.
//! - **Forced tokens are the grammar's canonical tokenization**: [`Constraint::forced`] returns
//!   the tokens the grammar allows as the only continuation (llguidance's fast-forward tokens:
//!   the model's own tokenizer applied to the forced bytes). Without fast-forward the mask admits
//!   exactly those tokens one at a time, so both paths produce the same tokens.
//! - **The prompt's KV never depends on the grammar**: a constraint only masks sampling, so
//!   cached prefixes are shared across grammars.

mod vocab;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory, TokenParser};
use toktrie::{SimpleVob, TokEnv};

use crate::invalid::PrepareError;

pub use vocab::{TokenBytes, Vocab};

/// What an answer must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A JSON Schema (OpenAI's `json_schema`).
    JsonSchema(serde_json::Value),
    /// A regular expression the whole answer matches (Rust regex syntax).
    Regex(String),
    /// A Lark grammar in llguidance's dialect.
    Lark(String),
}

impl Grammar {
    /// A short stable name (metrics labels, exposures).
    pub fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonObject => "json_object",
            Grammar::JsonSchema(_) => "json_schema",
            Grammar::Regex(_) => "regex",
            Grammar::Lark(_) => "lark",
        }
    }
}

/// Longest a grammar may take to compile (with its first mask) before it is refused.
pub const COMPILE_BUDGET: Duration = Duration::from_secs(2);

/// llguidance's limits as abserve sets them: its defaults, with fewer lexer states (memory per
/// sequence: about 1–2 kB each) and a smaller grammar.
pub fn limits() -> ParserLimits {
    ParserLimits {
        max_lexer_states: 50_000,
        max_grammar_size: 200_000,
        ..ParserLimits::default()
    }
}

/// JSON as the answers are written: `", "` and `": "` between items, no other whitespace (a
/// small model left free to write whitespace can write it forever). A schema's own
/// `x-guidance` object overrides this (llguidance's JSON options).
fn json_options() -> serde_json::Value {
    serde_json::json!({
        "item_separator": ", ",
        "key_separator": ": ",
        "whitespace_flexible": false,
    })
}

/// Grammars compiled (and the microseconds it took) and refused: at compile time here, or
/// during generation by the scheduler. Part of the engine's statistics (`EngineStats`).
#[derive(Debug, Default)]
pub struct GrammarStats {
    pub(crate) compiles: AtomicU64,
    pub(crate) compile_micros: AtomicU64,
    pub(crate) rejections: AtomicU64,
}

impl GrammarStats {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Compiles grammars for one model's vocabulary (built once, shared by every request).
pub struct Grammars {
    factory: ParserFactory,
    stats: Arc<GrammarStats>,
}

impl Grammars {
    pub fn new(vocab: Vocab, stats: Arc<GrammarStats>) -> Result<Grammars, String> {
        let env: TokEnv = vocab.into_env();
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Grammars { factory, stats })
    }

    /// `grammar` as a fresh matcher, or an error naming `field` (`response_format`, `tools`).
    pub fn compile(&self, grammar: &Grammar, field: &str) -> Result<Constraint, PrepareError> {
        let t0 = Instant::now();
        let top = match grammar {
            Grammar::JsonObject => json_schema(serde_json::json!({"type": "object"})),
            Grammar::JsonSchema(s) => json_schema(s.clone()),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
        };
        let refuse = |message: String| {
            GrammarStats::add(&self.stats.rejections, 1);
            PrepareError::new(field, message)
        };
        let parser = self.factory.create_parser(top);
        // a shallow copy shares the lexer's tables, so it can report their size as they grow
        let tables = parser.as_ref().ok().map(|p| Box::new(p.clone()));
        let mut matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(refuse(format!(
                "the {} does not compile: {e}",
                what(grammar)
            )));
        }
        // the first mask: proves the grammar can start, and warms the lexer
        if let Err(e) = matcher.compute_mask() {
            return Err(refuse(format!(
                "the {} allows no answer: {e}",
                what(grammar)
            )));
        }
        let took = t0.elapsed();
        GrammarStats::add(&self.stats.compiles, 1);
        GrammarStats::add(&self.stats.compile_micros, took.as_micros() as u64);
        if took > COMPILE_BUDGET {
            return Err(refuse(format!(
                "the {} took {} ms to compile, over the budget of {} ms",
                what(grammar),
                took.as_millis(),
                COMPILE_BUDGET.as_millis()
            ))
            .beyond(
                format!("{} ms", COMPILE_BUDGET.as_millis()),
                format!("{} ms", took.as_millis()),
            ));
        }
        Ok(Constraint {
            matcher,
            tables,
            kind: grammar.kind(),
            failed: None,
        })
    }
}

fn what(g: &Grammar) -> &'static str {
    match g {
        Grammar::JsonObject | Grammar::JsonSchema(_) => "JSON schema",
        Grammar::Regex(_) => "regular expression",
        Grammar::Lark(_) => "Lark grammar",
    }
}

fn json_schema(mut schema: serde_json::Value) -> TopLevelGrammar {
    close_objects(&mut schema);
    TopLevelGrammar::from_json_schema(with_json_options(schema))
}

/// Objects with listed `properties` and no word on others get `additionalProperties: false`,
/// as OpenAI's strict mode and xgrammar's strict mode read them: the answer is still valid under
/// the schema as written (a closed object is one of the open ones), and a small model cannot
/// wander into keys of its own. Schemas that combine objects with `allOf` are left as written
/// (closing both halves would make them unsatisfiable), as are those that say anything about
/// other keys (`additionalProperties`, `patternProperties`, `unevaluatedProperties`).
pub fn close_objects(schema: &mut serde_json::Value) {
    use serde_json::Value;
    let Value::Object(o) = schema else {
        return;
    };
    if o.contains_key("allOf") {
        return;
    }
    let open = [
        "additionalProperties",
        "patternProperties",
        "unevaluatedProperties",
    ]
    .iter()
    .all(|k| !o.contains_key(*k));
    let listed = o
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| !p.is_empty());
    if open && listed {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, v) in o.iter_mut() {
        match (k.as_str(), v) {
            // maps of schemas
            ("properties" | "$defs" | "definitions" | "dependentSchemas", Value::Object(m)) => {
                m.values_mut().for_each(close_objects)
            }
            // lists of schemas
            ("anyOf" | "oneOf" | "prefixItems", Value::Array(a)) => {
                a.iter_mut().for_each(close_objects)
            }
            // one schema
            ("items" | "additionalItems" | "not" | "if" | "then" | "else" | "contains", v) => {
                close_objects(v)
            }
            _ => {}
        }
    }
}

/// `schema` with abserve's JSON layout (`", "`, `": "`, no free whitespace) unless it sets its
/// own `x-guidance`; for schemas embedded in a Lark grammar (`%json { … }`) too.
pub fn with_json_options(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut() {
        if !obj.contains_key("x-guidance") {
            obj.insert("x-guidance".into(), json_options());
        }
    }
    schema
}

/// One sequence's grammar state: which tokens may come next, advanced by every accepted token.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    /// A copy of the fresh parser sharing the matcher's lexer (never advanced): reads the size
    /// of the lexer's tables, the part of a matcher that grows while it runs.
    tables: Option<Box<TokenParser>>,
    kind: &'static str,
    /// Why the matcher failed mid-generation (a per-step limit).
    failed: Option<String>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Constraint {
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The tokens allowed next (end-of-generation tokens only where the grammar may end).
    pub fn mask(&mut self) -> Result<SimpleVob, String> {
        self.matcher
            .compute_mask()
            .map_err(|e| self.fail(e.to_string()))
    }

    /// Advances the grammar by an accepted token.
    pub fn commit(&mut self, token: i32) -> Result<(), String> {
        self.matcher
            .consume_token(token as u32)
            .map_err(|e| self.fail(e.to_string()))
    }

    /// The tokens the grammar forces next (at most `max`), already committed.
    pub fn forced(&mut self, max: usize) -> Vec<i32> {
        if max == 0 || self.matcher.is_stopped() {
            return Vec::new();
        }
        let mut ff = self.matcher.compute_ff_tokens();
        ff.truncate(max);
        if ff.is_empty() || self.matcher.consume_tokens(&ff).is_err() {
            return Vec::new();
        }
        ff.into_iter().map(|t| t as i32).collect()
    }

    /// The grammar is complete and allows nothing more.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }

    /// The answer so far is a complete match (the grammar may end here).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// The matcher's lexer tables in bytes (llguidance's own estimate): the part of a matcher
    /// that grows with what it has seen, bounded by the lexer-state limit ([`limits`]). The
    /// Earley rows are bounded by `max_items_in_row` per lexeme and are not counted here.
    pub fn bytes(&self) -> u64 {
        self.tables
            .as_ref()
            .map_or(0, |t| t.parser.lexer_stats().num_bytes as u64)
    }

    /// Why the grammar failed during generation, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn fail(&mut self, e: String) -> String {
        self.failed.get_or_insert(e).clone()
    }
}

#[cfg(test)]
pub(crate) mod tests;
