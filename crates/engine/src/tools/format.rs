//! Reading tool calls out of an answer's text, per format (see the module doc of `tools`).
//! Text that holds no well-formed call stays the answer's content.

use serde::Deserialize;
use serde_json::value::RawValue;
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

/// A call as written: its name and its arguments' own text (a JSON object, or JSON text in a
/// string as some models write it), kept as written so that streamed pieces join into it.
#[derive(Deserialize)]
struct RawCall<'a> {
    name: String,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    parameters: Option<&'a RawValue>,
}

impl RawCall<'_> {
    fn parsed(self) -> ParsedCall {
        let arguments = match self.arguments.or(self.parameters).map(RawValue::get) {
            None => "{}".to_string(),
            Some(a) => match serde_json::from_str::<String>(a) {
                // some models write the arguments as JSON text already
                Ok(s) if serde_json::from_str::<Value>(&s).is_ok() => s,
                _ => a.to_string(),
            },
        };
        ParsedCall {
            name: self.name,
            arguments,
        }
    }
}

/// One call (an object) or several (an array) in `text`.
fn calls(text: &str) -> Option<Vec<ParsedCall>> {
    let t = text.trim();
    if t.starts_with('[') {
        let all: Vec<RawCall> = serde_json::from_str(t).ok()?;
        Some(all.into_iter().map(RawCall::parsed).collect())
    } else {
        let one: RawCall = serde_json::from_str(t).ok()?;
        Some(vec![one.parsed()])
    }
}

/// The generic format's answer: calls, or a direct response.
#[derive(Deserialize)]
struct Generic<'a> {
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(default)]
    response: Option<Value>,
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
            let Ok(v) = serde_json::from_str::<Generic>(answer.trim()) else {
                return whole();
            };
            if let Some(c) = v.tool_calls.and_then(|t| calls(t.get())) {
                return ParsedOutput {
                    content: None,
                    calls: c,
                };
            }
            match v.response {
                Some(Value::String(s)) => ParsedOutput {
                    content: Some(s),
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
                match calls(body).filter(|c| c.len() == 1) {
                    Some(c) => out.calls.extend(c),
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
            match calls(t) {
                Some(c) if !c.is_empty() => ParsedOutput {
                    content: None,
                    calls: c,
                },
                _ => whole(),
            }
        }
    }
}
