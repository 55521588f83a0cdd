//! Experiment definitions (TOML or JSON) and their validation: unique names and variant ids,
//! at least two variants, one control, weights ≥ 0, coverage in [0, 1], templates that render.

use minijinja::{context, Environment};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    #[default]
    Running,
    Paused,
    Stopped,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub id: String,
    #[serde(default = "one")]
    pub weight: f64,
    /// System prompt for chat requests.
    pub system: Option<String>,
    /// minijinja template of the user message; the user's input is `{{ input }}`.
    #[serde(default = "input_template")]
    pub template: String,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: Option<u32>,
    pub seed: Option<u64>,
    pub stop: Option<Vec<String>>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// OpenAI's `logit_bias` (token id as a string → bias).
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    /// What the answer must be (OpenAI's `response_format`; the schema is part of the variant).
    pub response_format: Option<abserve_protocol::ResponseFormat>,
    /// Function tools the model may call, and how (OpenAI's `tools`, `tool_choice`,
    /// `parallel_tool_calls`).
    pub tools: Option<Vec<abserve_protocol::Tool>>,
    pub tool_choice: Option<abserve_protocol::ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// LoRA adapters of the shared model this variant generates with (GGUF LoRA files and
    /// scales: `adapters = [{ path = "…", scale = 1.0 }]`).
    pub adapters: Option<Vec<abserve_protocol::Adapter>>,
    /// The id of the model this variant generates with, on a server of several models
    /// (`--model ID=FILE`); none: the default (first) model.
    pub model: Option<String>,
    /// Share (0, 1] of fan-out inputs this variant answers (`fanout.rs`; default all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fanout_rate: Option<f64>,
    /// Most its fan-out may spend per UTC day at its model's prices (`fanout.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_spend_cap: Option<f64>,
    /// Set when a guardrail stopped this variant (`guardrail.rs`): the evidence. A stopped
    /// variant gets no new units, and its units are served the control, not recorded. A
    /// definition put without it (PUT) restarts the variant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<abserve_statistics::Harm>,
}

/// A guardrail: a metric a treatment must not make worse beyond `tolerance` (a relative change
/// of control's mean, default 0), in the metric's direction. Written as a name (`"error"`) or a
/// table (`{ metric = "thumbs_down", tolerance = 0.1 }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(from = "GuardrailSpec")]
pub struct Guardrail {
    pub metric: String,
    pub tolerance: f64,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum GuardrailSpec {
    Name(String),
    Table {
        metric: String,
        #[serde(default)]
        tolerance: f64,
    },
}

impl From<GuardrailSpec> for Guardrail {
    fn from(s: GuardrailSpec) -> Guardrail {
        match s {
            GuardrailSpec::Name(metric) => Guardrail {
                metric,
                tolerance: 0.0,
            },
            GuardrailSpec::Table { metric, tolerance } => Guardrail { metric, tolerance },
        }
    }
}

/// Every experiment has `error` as a guardrail unless it lists its own (`guardrails = []`: none).
fn error_guardrail() -> Vec<Guardrail> {
    vec![Guardrail {
        metric: "error".into(),
        tolerance: 0.0,
    }]
}

fn one() -> f64 {
    1.0
}

fn input_template() -> String {
    "{{ input }}".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    pub name: String,
    /// Defaults to the experiment's name, as GrowthBook's `seed` defaults to its key.
    pub hash_seed: Option<String>,
    /// GrowthBook's name of the attribute units are hashed by (default `user`). The server reads
    /// `user` from OpenAI's `user` field and any other name from OpenAI's `metadata`.
    #[serde(default = "user_attr")]
    pub hash_attribute: String,
    #[serde(default = "two")]
    pub hash_version: u8,
    #[serde(default = "full")]
    pub coverage: f64,
    #[serde(default)]
    pub status: Status,
    /// Id of the control variant (default: the first).
    pub control: Option<String>,
    /// Largest share (0, 1] of KV cells this experiment's running sequences may hold.
    pub max_kv_share: Option<f64>,
    /// The priority class of its requests that name none (`service_tier`): `interactive` (the
    /// default of a routed request) or `fanout` (the default of a fan-out) or `batch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<abserve_protocol::Class>,
    /// Total units at which the sequential confidence sequence is narrowest (default 5000,
    /// GrowthBook's); see `sequential`.
    pub sequential_tuning: Option<f64>,
    /// Ratio metrics: per unit the sum of one metric over the sum of another (delta method).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ratios: Vec<RatioMetric>,
    /// Metric definitions (`[[experiment.metrics]]`: aggregation, direction, cap; see
    /// `metric.rs`); a metric without one is the mean of the unit's values, higher is better.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<abserve_statistics::MetricDef>,
    /// Metrics a treatment must not make worse; checked continuously by the server, which
    /// stops a treatment significantly worse on one (`guardrail.rs`). Default: `["error"]`.
    #[serde(default = "error_guardrail")]
    pub guardrails: Vec<Guardrail>,
    /// `fixed` (the default) or `bandit`: weights moved by Thompson sampling (`bandit.rs`).
    #[serde(
        default,
        skip_serializing_if = "abserve_statistics::bandit::Mode::is_fixed"
    )]
    pub mode: abserve_statistics::bandit::Mode,
    /// The outcome metric a bandit improves (in its definition's direction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_metric: Option<String>,
    /// A bandit's settings (`[experiment.bandit]`; defaults in `bandit.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandit: Option<abserve_statistics::bandit::BanditSettings>,
    /// A bandit's periods and winner, as the server wrote them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandit_state: Option<abserve_statistics::bandit::BanditState>,
    /// Sampled conversations kept for review (`[experiment.samples]`; off without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<crate::SampleRules>,
    pub variants: Vec<Variant>,
}

/// A ratio metric, e.g. `{ name = "tokens_per_success", numerator = "output_tokens",
/// denominator = "success" }`: numerator and denominator name automatic metrics
/// (`latency_ms`, `ttft_ms`, `output_tokens`, `error`) or outcome events' metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RatioMetric {
    pub name: String,
    pub numerator: String,
    pub denominator: String,
}

/// The metrics every exposure records by itself.
pub const AUTOMATIC_METRICS: [&str; 5] =
    ["latency_ms", "ttft_ms", "output_tokens", "cost", "error"];

fn user_attr() -> String {
    "user".into()
}
fn two() -> u8 {
    2
}
fn full() -> f64 {
    1.0
}

/// A file of experiments: `[[experiment]]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentFile {
    #[serde(default)]
    pub experiment: Vec<Experiment>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct Invalid(pub String);

impl Experiment {
    pub fn seed(&self) -> &str {
        self.hash_seed.as_deref().unwrap_or(&self.name)
    }

    pub fn control_index(&self) -> usize {
        self.control
            .as_ref()
            .and_then(|c| self.variants.iter().position(|v| &v.id == c))
            .unwrap_or(0)
    }

    /// Which way is better for `metric`: its definition's direction, else lower for the
    /// automatic `error`, `latency_ms`, `ttft_ms` and `cost`, else higher.
    pub fn direction_of(&self, metric: &str) -> abserve_statistics::Direction {
        use abserve_statistics::Direction;
        match self.metrics.iter().find(|m| m.name == metric) {
            Some(d) => d.direction,
            None if ["error", "latency_ms", "ttft_ms", "cost"].contains(&metric) => {
                Direction::Lower
            }
            None => Direction::Higher,
        }
    }

    /// The traffic split: the variants' weights, or a bandit's current period's.
    pub fn weights(&self) -> Vec<f64> {
        if let Some(w) = self.bandit_weights() {
            return w;
        }
        let total: f64 = self.variants.iter().map(|v| v.weight).sum();
        self.variants
            .iter()
            .map(|v| if total > 0.0 { v.weight / total } else { 0.0 })
            .collect()
    }

    /// Validates the definition for the server, where a template sees only `{{ input }}`.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.validate_shape()?;
        for v in &self.variants {
            render(&v.template, "test input").map_err(|e| {
                Invalid(format!(
                    "experiment '{}': variant '{}': {e}",
                    self.name, v.id
                ))
            })?;
        }
        Ok(())
    }

    /// Variant ids unique and not empty, weights ≥ 0, templates that compile.
    fn validate_variants(&self) -> Result<(), Invalid> {
        let bad = |m: String| Err(Invalid(format!("experiment '{}': {m}", self.name)));
        let mut seen = std::collections::HashSet::new();
        for v in &self.variants {
            if v.id.is_empty() {
                return bad("a variant has an empty id".into());
            }
            if !seen.insert(v.id.as_str()) {
                return bad(format!("duplicate variant id '{}'", v.id));
            }
            if !(v.weight.is_finite() && v.weight >= 0.0) {
                return bad(format!(
                    "variant '{}' has weight {}; weights must be ≥ 0",
                    v.id, v.weight
                ));
            }
            crate::fanout::check(v.fanout_rate, v.daily_spend_cap, v.max_tokens).map_err(|e| {
                Invalid(format!(
                    "experiment '{}': variant '{}': {e}",
                    self.name, v.id
                ))
            })?;
            template_fields(&v.template).map_err(|e| {
                Invalid(format!(
                    "experiment '{}': variant '{}': {e}",
                    self.name, v.id
                ))
            })?;
        }
        Ok(())
    }

    /// Everything but the templates' variables: names, ids, weights, control, coverage, quota.
    /// Templates must still compile. (`abserve eval` checks the variables against its dataset.)
    pub fn validate_shape(&self) -> Result<(), Invalid> {
        let bad = |m: String| Err(Invalid(format!("experiment '{}': {m}", self.name)));
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            || self.name.len() > 64
        {
            return Err(Invalid(format!(
                "experiment name '{}' must be 1-64 characters of letters, digits, '-', '_' or '.'",
                self.name
            )));
        }
        if self.variants.len() < 2 {
            return bad(format!(
                "needs at least two variants, has {}",
                self.variants.len()
            ));
        }
        self.validate_variants()?;
        if let Some(e) = self.samples.as_ref().and_then(|s| s.check().err()) {
            return bad(e);
        }
        let mut guarded = std::collections::HashSet::new();
        for g in &self.guardrails {
            if g.metric.is_empty() || !(g.tolerance.is_finite() && g.tolerance >= 0.0) {
                return bad(format!(
                    "guardrail '{}': a metric name and a tolerance ≥ 0 (a relative change of control's mean), got {}",
                    g.metric, g.tolerance
                ));
            }
            if !guarded.insert(g.metric.as_str()) {
                return bad(format!("guardrail '{}' is listed twice", g.metric));
            }
        }
        let mut defined = std::collections::HashSet::new();
        for m in &self.metrics {
            if let Some(e) = m.invalid() {
                return bad(e);
            }
            if !defined.insert(m.name.as_str()) {
                return bad(format!("metric '{}' is defined twice", m.name));
            }
        }
        if self.variants.iter().map(|v| v.weight).sum::<f64>() <= 0.0 {
            return bad("the weights sum to zero".into());
        }
        if let Some(c) = &self.control {
            if !self.variants.iter().any(|v| &v.id == c) {
                return bad(format!("control '{c}' is not one of the variants"));
            }
        }
        if !(self.coverage.is_finite() && (0.0..=1.0).contains(&self.coverage)) {
            return bad(format!(
                "coverage {} must be between 0 and 1",
                self.coverage
            ));
        }
        if let Some(s) = self.max_kv_share {
            if !(s > 0.0 && s <= 1.0) {
                return bad(format!("max_kv_share {s} must be in (0, 1]"));
            }
        }
        if let Some(t) = self.sequential_tuning {
            if !(t.is_finite() && t >= 1.0) {
                return bad(format!(
                    "sequential_tuning {t} must be a number of units ≥ 1"
                ));
            }
        }
        self.validate_ratios()?;
        self.validate_bandit()?;
        if !(1..=2).contains(&self.hash_version) {
            return bad(format!("hash_version {} must be 1 or 2", self.hash_version));
        }
        Ok(())
    }
}

/// Most template instructions one rendering may run (minijinja's fuel): bounds loops.
pub const TEMPLATE_FUEL: u64 = 100_000;
/// Most bytes one rendering may produce: a prompt larger than this fits no context we serve.
pub const MAX_RENDERED_BYTES: usize = 1 << 20;

/// A writer that refuses to grow past [`MAX_RENDERED_BYTES`] (and remembers that it did).
struct Capped(Vec<u8>, bool);

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + b.len() > MAX_RENDERED_BYTES {
            self.1 = true;
            return Err(std::io::Error::other("output limit"));
        }
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Renders `template` with `ctx` in a sandbox: strict variables, bounded instructions, bounded
/// output. Every variant template goes through here, on create and on every request.
fn render_bounded(template: &str, ctx: minijinja::Value) -> Result<String, String> {
    let mut env = Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.add_template("t", template)
        .map_err(|e| format!("template does not compile: {e}"))?;
    let mut out = Capped(Vec::new(), false);
    let r = env
        .get_template("t")
        .and_then(|t| t.render_captured_to(ctx, &mut out).map(|_| ()));
    if out.1 {
        return Err(format!(
            "template does not render: the rendered text is larger than {MAX_RENDERED_BYTES} bytes"
        ));
    }
    r.map_err(|e| format!("template does not render: {e}"))?;
    String::from_utf8(out.0).map_err(|_| "template rendered invalid UTF-8".to_string())
}

/// Renders a variant template with the user's input (strict: unknown variables are errors).
pub fn render(template: &str, input: &str) -> Result<String, String> {
    render_bounded(template, context! { input => input })
}

/// Renders a template with every field of a dataset row (strict: unknown variables are errors).
pub fn render_row(template: &str, row: &serde_json::Value) -> Result<String, String> {
    render_bounded(template, minijinja::Value::from_serialize(row))
}

/// The top-level variables a template reads (`{{ input }}`, `{{ row.x }}` gives `row`).
pub fn template_fields(template: &str) -> Result<std::collections::BTreeSet<String>, String> {
    let mut env = Environment::new();
    env.add_template("t", template)
        .map_err(|e| format!("template does not compile: {e}"))?;
    let t = env
        .get_template("t")
        .map_err(|e| format!("template does not compile: {e}"))?;
    Ok(t.undeclared_variables(false).into_iter().collect())
}

/// Parses and validates a TOML file of experiments; names must be unique.
pub fn parse_file(text: &str) -> Result<Vec<Experiment>, Invalid> {
    let f: ExperimentFile =
        toml::from_str(text).map_err(|e| Invalid(format!("experiments file: {e}")))?;
    let mut names = std::collections::HashSet::new();
    for e in &f.experiment {
        e.validate()?;
        if !names.insert(e.name.clone()) {
            return Err(Invalid(format!("duplicate experiment name '{}'", e.name)));
        }
    }
    Ok(f.experiment)
}

/// Parses and validates one experiment from TOML: its table's fields at the top level, or a
/// file with exactly one `[[experiment]]`.
pub fn parse_one(text: &str) -> Result<Experiment, Invalid> {
    let table: toml::Table = toml::from_str(text).map_err(|e| Invalid(format!("TOML: {e}")))?;
    if table.contains_key("experiment") {
        let mut all = parse_file(text)?;
        if all.len() != 1 {
            return Err(Invalid(format!(
                "expected one [[experiment]], found {}",
                all.len()
            )));
        }
        return Ok(all.remove(0));
    }
    let e: Experiment = toml::from_str(text).map_err(|e| Invalid(format!("TOML: {e}")))?;
    e.validate()?;
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[[experiment]]
name = "support-tone"
control = "terse"
max_kv_share = 0.5

[[experiment.variants]]
id = "terse"
weight = 0.5
system = "Be brief."
template = "Customer: {{ input }}"
temperature = 0.0

[[experiment.variants]]
id = "friendly"
weight = 0.5
system = "Be warm and friendly."
"#;

    #[test]
    fn parses_a_good_file() {
        let e = parse_file(GOOD).unwrap();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].seed(), "support-tone");
        assert_eq!(e[0].control_index(), 0);
        assert_eq!(e[0].variants[1].template, "{{ input }}");
        assert_eq!(
            render(&e[0].variants[0].template, "hi").unwrap(),
            "Customer: hi"
        );
        // hostile templates end with an error, not a stall or a 100 MB prompt
        let big = render("{{ 'x' * 50000000 }}", "hi").unwrap_err();
        assert!(big.contains("larger than"), "{big}");
        let long = render(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "hi",
        )
        .unwrap_err();
        assert!(long.contains("fuel"), "{long}");
    }

    #[test]
    fn one_experiment_parses_from_its_table_or_a_file_of_one() {
        let file = parse_one(GOOD).unwrap();
        let table = parse_one(
            &GOOD
                .replace("[[experiment]]\n", "")
                .replace("[[experiment.variants]]", "[[variants]]"),
        )
        .unwrap();
        assert_eq!(file, table);
        let two = format!("{GOOD}\n{}", GOOD.replace("support-tone", "other"));
        assert!(parse_one(&two).unwrap_err().0.contains("expected one"));
        assert!(parse_one("name = ").unwrap_err().0.starts_with("TOML"));
    }

    #[test]
    fn rejects_bad_definitions_with_the_reason() {
        let dup = GOOD.replace("id = \"friendly\"", "id = \"terse\"");
        assert!(parse_file(&dup)
            .unwrap_err()
            .0
            .contains("duplicate variant id 'terse'"));
        let neg = GOOD.replace(
            "weight = 0.5\nsystem = \"Be warm",
            "weight = -1.0\nsystem = \"Be warm",
        );
        assert!(parse_file(&neg)
            .unwrap_err()
            .0
            .contains("weights must be ≥ 0"));
        let tmpl = GOOD.replace("Customer: {{ input }}", "Customer: {{ input ");
        assert!(parse_file(&tmpl)
            .unwrap_err()
            .0
            .contains("template does not compile"));
        let missing = GOOD.replace("Customer: {{ input }}", "Customer: {{ nothing_here }}");
        assert!(parse_file(&missing)
            .unwrap_err()
            .0
            .contains("template does not render"));
        let control = GOOD.replace("control = \"terse\"", "control = \"nobody\"");
        assert!(parse_file(&control)
            .unwrap_err()
            .0
            .contains("control 'nobody'"));
        let one = &GOOD[..GOOD
            .find("[[experiment.variants]]\nid = \"friendly\"")
            .unwrap()];
        assert!(parse_file(one)
            .unwrap_err()
            .0
            .contains("at least two variants"));
        let twice = format!("{GOOD}\n{}", GOOD);
        assert!(parse_file(&twice)
            .unwrap_err()
            .0
            .contains("duplicate experiment name"));
        let share = GOOD.replace("max_kv_share = 0.5", "max_kv_share = 1.5");
        assert!(parse_file(&share).unwrap_err().0.contains("max_kv_share"));
        let tuning = GOOD.replace("max_kv_share = 0.5", "sequential_tuning = 0");
        assert!(parse_file(&tuning)
            .unwrap_err()
            .0
            .contains("sequential_tuning 0"));
        let ratio = GOOD.replace(
            "max_kv_share = 0.5",
            "ratios = [{ name = \"x\", numerator = \"error\", denominator = \"error\" }]",
        );
        assert!(parse_file(&ratio)
            .unwrap_err()
            .0
            .contains("divides 'error' by itself"));
        let ratio = GOOD.replace(
            "max_kv_share = 0.5",
            "ratios = [{ name = \"error\", numerator = \"a\", denominator = \"b\" }]",
        );
        assert!(parse_file(&ratio).unwrap_err().0.contains("repeats"));
        let ok = GOOD.replace("max_kv_share = 0.5", "ratios = [{ name = \"tokens_per_success\", numerator = \"output_tokens\", denominator = \"success\" }]");
        assert_eq!(parse_file(&ok).unwrap()[0].ratios[0].denominator, "success");
        let unknown = GOOD.replace("max_kv_share = 0.5", "colour = \"red\"");
        assert!(parse_file(&unknown).unwrap_err().0.contains("colour"));
    }
}
