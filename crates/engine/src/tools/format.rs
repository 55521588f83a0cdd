//! Reading tool calls out of an answer's text, per format (see the module doc of `tools`).
//! Text that holds no well-formed call stays the answer's content.

use serde_json::Value;

use super::ToolFormat;

/// One call read from an answer: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// An answer's content (what is not a call) and its calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    pub content: Option<String>,
    pub calls: Vec<ParsedCall>,
}

fn call(v: &Value, args: &[&str]) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let a = args.iter().find_map(|k| v.get(*k));
    let arguments = match a {
        None => "{}".to_string(),
        // some models write the arguments as JSON text already
        Some(Value::String(s)) if serde_json::from_str::<Value>(s).is_ok() => s.clone(),
        Some(v) => v.to_string(),
    };
    Some(ParsedCall { name, arguments })
}

fn calls(v: &Value, args: &[&str]) -> Option<Vec<ParsedCall>> {
    match v {
        Value::Array(items) => items.iter().map(|i| call(i, args)).collect(),
        Value::Object(_) => call(v, args).map(|c| vec![c]),
        _ => None,
    }
}

fn text(s: &str) -> Option<String> {
    let t = s.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// The calls and content of `answer`, written in `format`.
pub fn parse(format: ToolFormat, answer: &str) -> ParsedOutput {
    let whole = || ParsedOutput {
        content: Some(answer.to_string()),
        calls: vec![],
    };
    match format {
        ToolFormat::Generic => {
            let Ok(v) = serde_json::from_str::<Value>(answer.trim()) else {
                return whole();
            };
            if let Some(c) = v.get("tool_calls").and_then(|t| calls(t, &["arguments"])) {
                return ParsedOutput {
                    content: None,
                    calls: c,
                };
            }
            match v.get("response") {
                Some(Value::String(s)) => ParsedOutput {
                    content: Some(s.clone()),
                    calls: vec![],
                },
                Some(other) => ParsedOutput {
                    content: Some(other.to_string()),
                    calls: vec![],
                },
                None => whole(),
            }
        }
        ToolFormat::Hermes => {
            let mut out = ParsedOutput::default();
            let mut rest = String::new();
            let mut s = answer;
            while let Some(start) = s.find("<tool_call>") {
                let Some(len) = s[start..].find("</tool_call>") else {
                    break;
                };
                let body = &s[start + "<tool_call>".len()..start + len];
                match serde_json::from_str::<Value>(body.trim())
                    .ok()
                    .and_then(|v| call(&v, &["arguments", "parameters"]))
                {
                    Some(c) => out.calls.push(c),
                    None => return whole(),
                }
                rest.push_str(&s[..start]);
                s = &s[start + len + "</tool_call>".len()..];
            }
            rest.push_str(s);
            out.content = text(&rest);
            out
        }
        ToolFormat::Llama3 | ToolFormat::Mistral => {
            let t = answer.trim();
            let t = t.strip_prefix("<|python_tag|>").unwrap_or(t);
            let t = t.strip_prefix("[TOOL_CALLS]").unwrap_or(t).trim();
            if !(t.starts_with('{') || t.starts_with('[')) {
                return whole();
            }
            match serde_json::from_str::<Value>(t)
                .ok()
                .and_then(|v| calls(&v, &["arguments", "parameters"]))
            {
                Some(c) if !c.is_empty() => ParsedOutput {
                    content: None,
                    calls: c,
                },
                _ => whole(),
            }
        }
    }
}
