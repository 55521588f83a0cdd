//! The evaluation file: one `[[experiment]]` in the same format as `abserve serve
//! --experiments`, plus `[[scorer]]` tables. Everything is checked here, before any model work.

use std::path::{Path, PathBuf};

use abserve_ab::{template_fields, Experiment};
use serde::Deserialize;

use crate::error::EvalError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EvalFile {
    #[serde(default)]
    experiment: Vec<Experiment>,
    #[serde(default)]
    scorer: Vec<ScorerDef>,
}

/// One `[[scorer]]` table as written; `kind` is checked in [`ScorerDef::build`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScorerDef {
    #[serde(rename = "type")]
    pub kind: String,
    /// Column name in results and reports (default: the type).
    pub name: Option<String>,
    /// exact/contains: template of the expected text over the row's fields.
    pub expected: Option<String>,
    pub case_sensitive: Option<bool>,
    /// regex: pattern the output must match.
    pub pattern: Option<String>,
    /// json_schema: the schema inline (a TOML table) or in a file next to the eval file.
    pub schema: Option<toml::Value>,
    pub schema_file: Option<PathBuf>,
    /// length: chars, words or tokens.
    pub unit: Option<String>,
    /// length: with `max`, the score is pass/fail "at most max units".
    pub max: Option<f64>,
    /// command: argv; the row's JSON arrives on stdin and a number is read from stdout.
    pub command: Option<Vec<String>>,
    /// command: seconds before the command is killed and the row gets no score.
    pub timeout: Option<f64>,
    /// judge: OpenAI-compatible endpoint of the judge (default: the evaluated target).
    pub url: Option<String>,
    /// judge: model name at that endpoint.
    pub model: Option<String>,
    /// judge: the question asked; sees `input`, `a`, `b` and the row's fields.
    pub prompt: Option<String>,
    /// judge: the seed of the judge's requests (both orders are asked, greedily).
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthUnit {
    Chars,
    Words,
    Tokens,
}

#[derive(Debug, Clone)]
pub enum ScorerKind {
    Exact {
        expected: String,
        case_sensitive: bool,
    },
    Contains {
        expected: String,
        case_sensitive: bool,
    },
    Regex {
        re: regex::Regex,
    },
    JsonValid,
    /// `None`: each variant's own `response_format` schema (the share of valid answers per
    /// variant).
    JsonSchema {
        schema: Option<serde_json::Value>,
    },
    Length {
        unit: LengthUnit,
        max: Option<f64>,
    },
    Latency,
    Command {
        argv: Vec<String>,
        timeout: std::time::Duration,
    },
    Judge {
        url: Option<String>,
        model: Option<String>,
        prompt: String,
        seed: u64,
    },
}

#[derive(Debug, Clone)]
pub struct Scorer {
    pub name: String,
    pub kind: ScorerKind,
}

/// Whether a score is pass/fail (1/0), a number, or a judge verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreType {
    Binary,
    Continuous,
    Preference,
}

/// Which direction is better for a score (for the report's colouring and wording).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
    Neither,
}

pub const KNOWN: &[&str] = &[
    "exact",
    "contains",
    "regex",
    "json_valid",
    "json_schema",
    "length",
    "latency",
    "command",
    "judge",
];

pub const DEFAULT_JUDGE_PROMPT: &str = "Two assistants answered the same message.\n\nMessage:\n{{ input }}\n\n[Answer A]\n{{ a }}\n\n[Answer B]\n{{ b }}\n\nWhich answer is more helpful, correct and clear? Reply with one letter: A or B.";

impl Scorer {
    pub fn score_type(&self) -> ScoreType {
        match &self.kind {
            ScorerKind::Exact { .. } | ScorerKind::Contains { .. } | ScorerKind::Regex { .. } => {
                ScoreType::Binary
            }
            ScorerKind::JsonValid | ScorerKind::JsonSchema { .. } => ScoreType::Binary,
            ScorerKind::Length { max: Some(_), .. } => ScoreType::Binary,
            ScorerKind::Length { max: None, .. }
            | ScorerKind::Latency
            | ScorerKind::Command { .. } => ScoreType::Continuous,
            ScorerKind::Judge { .. } => ScoreType::Preference,
        }
    }

    pub fn better(&self) -> Better {
        match &self.kind {
            ScorerKind::Latency => Better::Lower,
            ScorerKind::Length { max: None, .. } => Better::Neither,
            _ => Better::Higher,
        }
    }

    /// Template strings this scorer renders with a row's fields.
    pub fn templates(&self) -> Vec<&str> {
        match &self.kind {
            ScorerKind::Exact { expected, .. } | ScorerKind::Contains { expected, .. } => {
                vec![expected.as_str()]
            }
            _ => vec![],
        }
    }
}

impl ScorerDef {
    /// What is wrong with the fields, if anything: the type must be known and only the fields
    /// that type reads may be set.
    fn field_problem(&self) -> Option<String> {
        let allowed: &[&str] = match self.kind.as_str() {
            "exact" | "contains" => &["expected", "case_sensitive"],
            "regex" => &["pattern"],
            "json_valid" | "latency" => &[],
            "json_schema" => &["schema", "schema_file"],
            "length" => &["unit", "max"],
            "command" => &["command", "timeout"],
            "judge" => &["url", "model", "prompt", "seed"],
            other => {
                return Some(format!(
                    "unknown scorer type '{other}' (known: {})",
                    KNOWN.join(", ")
                ))
            }
        };
        let given = [
            ("expected", self.expected.is_some()),
            ("case_sensitive", self.case_sensitive.is_some()),
            ("pattern", self.pattern.is_some()),
            ("schema", self.schema.is_some()),
            ("schema_file", self.schema_file.is_some()),
            ("unit", self.unit.is_some()),
            ("max", self.max.is_some()),
            ("command", self.command.is_some()),
            ("timeout", self.timeout.is_some()),
            ("url", self.url.is_some()),
            ("model", self.model.is_some()),
            ("prompt", self.prompt.is_some()),
            ("seed", self.seed.is_some()),
        ];
        let (f, _) = given.iter().find(|(f, set)| *set && !allowed.contains(f))?;
        Some(format!("'{f}' does not apply to a {} scorer", self.kind))
    }

    /// A `json_schema` scorer: its schema inline or from a file beside the config, checked; with
    /// neither, each variant's `response_format` schema.
    fn json_schema_kind(&self, base_dir: &Path) -> Result<ScorerKind, String> {
        let schema: serde_json::Value =
            match (&self.schema, &self.schema_file) {
                (None, None) => return Ok(ScorerKind::JsonSchema { schema: None }),
                (Some(s), None) => serde_json::to_value(s).map_err(|e| e.to_string())?,
                (None, Some(f)) => {
                    let path = base_dir.join(f);
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                    serde_json::from_str(&text)
                        .map_err(|e| format!("{} is not JSON: {e}", path.display()))?
                }
                _ => return Err(
                    "give one of schema or schema_file (or neither: the variant's response_format)"
                        .into(),
                ),
            };
        jsonschema::validator_for(&schema).map_err(|e| format!("invalid JSON schema: {e}"))?;
        Ok(ScorerKind::JsonSchema {
            schema: Some(schema),
        })
    }

    /// A `length` scorer: its unit and an optional maximum ≥ 0.
    fn length_kind(&self) -> Result<ScorerKind, String> {
        let unit = match self.unit.as_deref().unwrap_or("words") {
            "chars" => LengthUnit::Chars,
            "words" => LengthUnit::Words,
            "tokens" => LengthUnit::Tokens,
            u => return Err(format!("unit '{u}' must be chars, words or tokens")),
        };
        if let Some(m) = self.max {
            if !(m.is_finite() && m >= 0.0) {
                return Err(format!("max {m} must be a number ≥ 0"));
            }
        }
        Ok(ScorerKind::Length {
            unit,
            max: self.max,
        })
    }

    /// A `command` scorer: a program with its arguments and a positive timeout (default 10 s).
    fn command_kind(&self) -> Result<ScorerKind, String> {
        let argv = self
            .command
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| "needs command = [\"program\", \"arg\", ...]".to_string())?;
        let t = self.timeout.unwrap_or(10.0);
        if !(t.is_finite() && t > 0.0) {
            return Err(format!("timeout {t} must be a positive number of seconds"));
        }
        Ok(ScorerKind::Command {
            argv,
            timeout: std::time::Duration::from_secs_f64(t),
        })
    }

    pub fn build(&self, base_dir: &Path) -> Result<Scorer, EvalError> {
        let name = self.name.clone().unwrap_or_else(|| self.kind.clone());
        let at = |m: String| EvalError::Config(format!("scorer '{name}': {m}"));
        if let Some(m) = self.field_problem() {
            return Err(at(m));
        }
        let expected = || -> Result<String, EvalError> {
            let t = self
                .expected
                .clone()
                .unwrap_or_else(|| "{{ expected }}".into());
            template_fields(&t).map_err(|e| at(format!("expected: {e}")))?;
            Ok(t)
        };
        let kind = match self.kind.as_str() {
            "exact" => ScorerKind::Exact {
                expected: expected()?,
                case_sensitive: self.case_sensitive.unwrap_or(false),
            },
            "contains" => ScorerKind::Contains {
                expected: expected()?,
                case_sensitive: self.case_sensitive.unwrap_or(false),
            },
            "regex" => {
                let p = self
                    .pattern
                    .as_deref()
                    .ok_or_else(|| at("needs a pattern".into()))?;
                ScorerKind::Regex {
                    re: regex::Regex::new(p).map_err(|e| at(format!("bad pattern: {e}")))?,
                }
            }
            "json_valid" => ScorerKind::JsonValid,
            "json_schema" => self.json_schema_kind(base_dir).map_err(at)?,
            "length" => self.length_kind().map_err(at)?,
            "latency" => ScorerKind::Latency,
            "command" => self.command_kind().map_err(at)?,
            "judge" => {
                let prompt = self
                    .prompt
                    .clone()
                    .unwrap_or_else(|| DEFAULT_JUDGE_PROMPT.into());
                template_fields(&prompt).map_err(|e| at(format!("prompt: {e}")))?;
                ScorerKind::Judge {
                    url: self.url.clone(),
                    model: self.model.clone(),
                    prompt,
                    seed: self.seed.unwrap_or(0),
                }
            }
            _ => unreachable!("checked above"),
        };
        Ok(Scorer { name, kind })
    }
}

/// A checked evaluation: the experiment (control first in `order`) and its scorers.
#[derive(Debug, Clone)]
pub struct EvalConfig {
    pub experiment: Experiment,
    pub scorers: Vec<Scorer>,
}

impl EvalConfig {
    pub fn load(path: &Path) -> Result<EvalConfig, EvalError> {
        let text = std::fs::read_to_string(path).map_err(EvalError::io(path))?;
        Self::parse(&text, path.parent().unwrap_or(Path::new(".")))
            .map_err(|e| EvalError::Config(format!("{}: {e}", path.display())))
    }

    pub fn parse(text: &str, base_dir: &Path) -> Result<EvalConfig, EvalError> {
        let f: EvalFile = toml::from_str(text).map_err(|e| EvalError::Config(e.to_string()))?;
        let mut exps = f.experiment;
        if exps.len() != 1 {
            return Err(EvalError::Config(format!(
                "needs exactly one [[experiment]], found {}",
                exps.len()
            )));
        }
        let experiment = exps.remove(0);
        experiment
            .validate_shape()
            .map_err(|e| EvalError::Config(e.0))?;
        let mut scorers = Vec::new();
        let mut names = std::collections::HashSet::new();
        for d in &f.scorer {
            let s = d.build(base_dir)?;
            if !names.insert(s.name.clone()) {
                return Err(EvalError::Config(format!(
                    "two scorers are named '{}'; give one a name = \"...\"",
                    s.name
                )));
            }
            scorers.push(s);
        }
        Ok(EvalConfig {
            experiment,
            scorers,
        })
    }

    pub fn control(&self) -> &str {
        &self.experiment.variants[self.experiment.control_index()].id
    }

    pub fn judge(&self) -> Option<&Scorer> {
        self.scorers
            .iter()
            .find(|s| matches!(s.kind, ScorerKind::Judge { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[[experiment]]
name = "t"
[[experiment.variants]]
id = "a"
[[experiment.variants]]
id = "b"
template = "{{ category }}: {{ input }}"
"#;

    fn parse(extra: &str) -> Result<EvalConfig, EvalError> {
        EvalConfig::parse(&format!("{BASE}{extra}"), Path::new("."))
    }

    #[test]
    fn scorers_parse_and_bad_ones_say_why() {
        let c = parse("[[scorer]]\ntype = \"contains\"\n[[scorer]]\ntype = \"length\"\nmax = 50\n[[scorer]]\ntype = \"judge\"\n").unwrap();
        assert_eq!(c.scorers.len(), 3);
        assert_eq!(c.scorers[1].score_type(), ScoreType::Binary);
        assert_eq!(c.control(), "a");
        let e = parse("[[scorer]]\ntype = \"bleu\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown scorer type 'bleu'") && e.contains("contains"),
            "{e}"
        );
        let e = parse("[[scorer]]\ntype = \"regex\"\npattern = \"(\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad pattern"), "{e}");
        let e = parse("[[scorer]]\ntype = \"latency\"\npattern = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("'pattern' does not apply"), "{e}");
        let e = parse("[[scorer]]\ntype = \"latency\"\n[[scorer]]\ntype = \"latency\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("two scorers are named 'latency'"), "{e}");
        let e = parse("[[scorer]]\ntype = \"json_schema\"\nschema = { type = 12 }\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("invalid JSON schema"), "{e}");
        let e = parse("[[scorer]]\ntype = \"command\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs command"), "{e}");
    }
}
