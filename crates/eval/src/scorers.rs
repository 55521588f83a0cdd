//! Scorers grade one answer of one variant to one row. Pass/fail scorers give 1 or 0, the
//! others a number; a scorer that cannot score (a command that fails or times out) gives an
//! error for that row and no score. The judge compares two answers and lives in `judge.rs`.

use std::process::Stdio;

use abserve_ab::render_row;
use abserve_engine::grammar::Grammar;
use abserve_engine::prepare::response_grammar;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::{LengthUnit, Scorer, ScorerKind};
use crate::dataset::Row;
use crate::error::ScoreError;
use crate::results::ResultRow;

fn b(x: bool) -> f64 {
    if x {
        1.0
    } else {
        0.0
    }
}

fn fold(s: &str, case_sensitive: bool) -> String {
    let t = s.trim();
    if case_sensitive {
        t.to_string()
    } else {
        t.to_lowercase()
    }
}

/// The JSON in an answer: the whole text, or the body of one ```json fenced block.
pub fn json_of(output: &str) -> Option<Value> {
    let t = output.trim();
    if let Ok(v) = serde_json::from_str(t) {
        return Some(v);
    }
    let inner = t
        .strip_prefix("```")?
        .trim_start_matches("json")
        .strip_suffix("```")?;
    serde_json::from_str(inner.trim()).ok()
}

/// The JSON Schema a variant's `response_format` asks for (`json_object`: any object), read
/// as the engine reads it (`abserve_engine::prepare::response_grammar`).
pub fn variant_schema(v: &abserve_ab::Variant) -> Option<Value> {
    match response_grammar(v.response_format.as_ref())? {
        Grammar::JsonSchema(s) => Some(s),
        Grammar::JsonObject => Some(json!({"type": "object"})),
        Grammar::Regex(_) | Grammar::Lark(_) => None,
    }
}

/// Scores a finished answer of variant `v`. `row_ctx` is the row's fields as a JSON object.
pub async fn score(
    s: &Scorer,
    row: &Row,
    r: &ResultRow,
    v: Option<&abserve_ab::Variant>,
) -> Result<f64, ScoreError> {
    let output = r.output.as_deref().unwrap_or_default();
    let ctx = Value::Object(row.fields.clone());
    match &s.kind {
        ScorerKind::Exact {
            expected,
            case_sensitive,
        } => {
            let want = render_row(expected, &ctx).map_err(ScoreError::Template)?;
            Ok(b(
                fold(output, *case_sensitive) == fold(&want, *case_sensitive)
            ))
        }
        ScorerKind::Contains {
            expected,
            case_sensitive,
        } => {
            let want = render_row(expected, &ctx).map_err(ScoreError::Template)?;
            Ok(b(
                fold(output, *case_sensitive).contains(&fold(&want, *case_sensitive))
            ))
        }
        ScorerKind::Regex { re } => Ok(b(re.is_match(output))),
        ScorerKind::JsonValid => Ok(b(json_of(output).is_some())),
        ScorerKind::JsonSchema { schema } => {
            let own = v.and_then(variant_schema);
            let schema = schema.as_ref().or(own.as_ref()).ok_or_else(|| {
                ScoreError::Schema(format!(
                    "variant '{}' has no JSON response_format to score against",
                    r.variant
                ))
            })?;
            let val =
                jsonschema::validator_for(schema).map_err(|e| ScoreError::Schema(e.to_string()))?;
            Ok(b(json_of(output).is_some_and(|j| val.is_valid(&j))))
        }
        ScorerKind::Length { unit, max } => {
            let n = match unit {
                LengthUnit::Chars => output.chars().count() as f64,
                LengthUnit::Words => output.split_whitespace().count() as f64,
                LengthUnit::Tokens => r.completion_tokens as f64,
            };
            Ok(match max {
                Some(m) => b(n <= *m),
                None => n,
            })
        }
        ScorerKind::Latency => r.latency_ms.map(|ms| ms / 1e3).ok_or(ScoreError::NoLatency),
        ScorerKind::Command { argv, timeout } => {
            let input = json!({
                "row": row.id, "variant": r.variant, "input": row.input(), "expected": row.expected(),
                "output": output, "fields": ctx, "completion_tokens": r.completion_tokens, "latency_ms": r.latency_ms,
            });
            run_command(argv, &input, *timeout).await
        }
        ScorerKind::Judge { .. } => Err(ScoreError::Pair),
    }
}

async fn run_command(
    argv: &[String],
    input: &Value,
    timeout: std::time::Duration,
) -> Result<f64, ScoreError> {
    let command = argv[0].clone();
    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| ScoreError::Spawn {
            command: command.clone(),
            message: e.to_string(),
        })?;
    let mut stdin = child.stdin.take().expect("piped");
    let body = serde_json::to_vec(input).expect("serializable");
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let work = async {
        // a command that never reads its stdin must not block us
        let _ = stdin.write_all(&body).await;
        drop(stdin);
        let (mut out, mut err) = (String::new(), String::new());
        let _ = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        let status = child.wait().await.map_err(|e| ScoreError::Spawn {
            command: command.clone(),
            message: e.to_string(),
        })?;
        Ok::<_, ScoreError>((status, out, err))
    };
    let (status, out, err) =
        tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| ScoreError::Timeout {
                command: command.clone(),
                seconds: timeout.as_secs_f64(),
            })??;
    if !status.success() {
        return Err(ScoreError::Exit {
            command,
            status: status.to_string(),
            stderr: err.trim().to_string(),
        });
    }
    out.split_whitespace()
        .next()
        .and_then(|w| w.parse::<f64>().ok())
        .filter(|x| x.is_finite())
        .ok_or_else(|| ScoreError::Output {
            command,
            output: out.trim().to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScorerDef;

    fn scorer(toml_text: &str) -> Scorer {
        let d: ScorerDef = toml::from_str(toml_text).unwrap();
        d.build(std::path::Path::new(".")).unwrap()
    }

    fn result(output: &str) -> ResultRow {
        ResultRow {
            row: "r".into(),
            line: 1,
            variant: "v".into(),
            input: "q".into(),
            expected: None,
            output: Some(output.into()),
            prompt_tokens: 3,
            completion_tokens: 7,
            ttft_ms: Some(10.0),
            latency_ms: Some(250.0),
            finish_reason: Some("stop".into()),
            scores: Default::default(),
            score_errors: Default::default(),
            error: None,
            attempts: 1,
        }
    }

    fn row() -> Row {
        let fields = json!({"input": "q", "expected": "Paris", "n": 2})
            .as_object()
            .unwrap()
            .clone();
        Row {
            id: "r".into(),
            line: 1,
            fields,
        }
    }

    #[tokio::test]
    async fn each_scorer_grades() {
        let r = row();
        let s = |t: &str| scorer(t);
        assert_eq!(
            score(&s("type='exact'"), &r, &result(" paris\n"), None).await,
            Ok(1.0)
        );
        assert_eq!(
            score(
                &s("type='exact'\ncase_sensitive=true"),
                &r,
                &result("paris"),
                None
            )
            .await,
            Ok(0.0)
        );
        assert_eq!(
            score(&s("type='contains'"), &r, &result("It is PARIS."), None).await,
            Ok(1.0)
        );
        assert_eq!(
            score(
                &s("type='contains'\nexpected='{{ n }} days'"),
                &r,
                &result("in 2 days"),
                None
            )
            .await,
            Ok(1.0)
        );
        assert_eq!(
            score(
                &s("type='regex'\npattern='^\\d+$'"),
                &r,
                &result("42"),
                None
            )
            .await,
            Ok(1.0)
        );
        assert_eq!(
            score(
                &s("type='json_valid'"),
                &r,
                &result("```json\n{\"a\": 1}\n```"),
                None
            )
            .await,
            Ok(1.0)
        );
        assert_eq!(
            score(&s("type='json_valid'"), &r, &result("{a: 1}"), None).await,
            Ok(0.0)
        );
        let schema = "type='json_schema'\nschema={type='object', required=['a'], properties={a={type='integer'}}}";
        assert_eq!(
            score(&s(schema), &r, &result("{\"a\": 1}"), None).await,
            Ok(1.0)
        );
        assert_eq!(
            score(&s(schema), &r, &result("{\"a\": \"x\"}"), None).await,
            Ok(0.0)
        );
        // without a schema of its own, the scorer takes the variant's response_format
        let own = s("type='json_schema'");
        let v: abserve_ab::Variant = toml::from_str(
            "id = 'v'\nresponse_format = { type = 'json_schema', json_schema = { name = 'x', schema = { type = 'object', required = ['b'] } } }",
        )
        .unwrap();
        assert_eq!(
            score(&own, &r, &result("{\"b\": 2}"), Some(&v)).await,
            Ok(1.0)
        );
        assert_eq!(
            score(&own, &r, &result("{\"a\": 2}"), Some(&v)).await,
            Ok(0.0)
        );
        let free: abserve_ab::Variant = toml::from_str("id = 'f'").unwrap();
        assert!(score(&own, &r, &result("{}"), Some(&free)).await.is_err());
        assert_eq!(
            score(&s("type='length'"), &r, &result("three small words"), None).await,
            Ok(3.0)
        );
        assert_eq!(
            score(
                &s("type='length'\nunit='tokens'\nmax=5"),
                &r,
                &result("x"),
                None
            )
            .await,
            Ok(0.0)
        );
        assert_eq!(
            score(
                &s("type='length'\nunit='chars'"),
                &r,
                &result("héllo"),
                None
            )
            .await,
            Ok(5.0)
        );
        assert_eq!(
            score(&s("type='latency'"), &r, &result("x"), None).await,
            Ok(0.25)
        );
    }

    #[tokio::test]
    async fn command_scorer_reads_the_row_and_times_out() {
        let r = row();
        let py =
            "import json,sys; d=json.load(sys.stdin); print(len(d['output']) + d['fields']['n'])";
        let s = scorer(&format!(
            "type='command'\ncommand=['python3', '-c', \"{py}\"]"
        ));
        assert_eq!(score(&s, &r, &result("abc"), None).await, Ok(5.0));
        let slow = scorer("type='command'\ncommand=['sleep', '5']\ntimeout=0.2");
        assert!(matches!(
            score(&slow, &r, &result("x"), None).await,
            Err(ScoreError::Timeout { .. })
        ));
        let bad = scorer("type='command'\ncommand=['sh', '-c', 'echo nope']");
        assert!(matches!(
            score(&bad, &r, &result("x"), None).await,
            Err(ScoreError::Output { .. })
        ));
    }
}
