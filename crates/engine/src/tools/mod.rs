//! Function tools: a chat request's `tools` and `tool_choice` as what the model is told (the
//! tools in its chat template, or abserve's generic format where the template has none), the
//! grammar its answer must match, and how its text becomes `tool_calls`.
//!
//! Formats, recognised from the model's chat template ([`ToolFormat::detect`]):
//! - `hermes` (Hermes, Qwen 2.5/3: the template mentions `<tool_call>`): each call is
//!   `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`;
//! - `llama3` (Llama 3.1+: `<|python_tag|>` or an `ipython` role): one call as
//!   `{"name": …, "parameters": {…}}`;
//! - `mistral` (`[TOOL_CALLS]`): `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`;
//! - `generic` (every other template, the default model's included): abserve describes the
//!   tools in a system message and the answer is one JSON object, `{"tool_calls": [{"name": …,
//!   "arguments": {…}}, …]}` to call tools or `{"response": "…"}` to answer directly.
//!
//! Constraint: with `tool_choice` `required` or a named function the answer is constrained to
//! calls whose arguments match their tool's `parameters` schema (at most one call when
//! `parallel_tool_calls` is false); with `auto` the generic format is constrained to a call or
//! a response, the native formats generate freely and their calls are parsed; `none` renders
//! no tools and parses nothing.

mod format;
mod stream;

use abserve_protocol::{Tool, ToolChoice};
use serde_json::{json, Value};

use crate::grammar::{close_objects, with_json_options, Grammar};
use crate::invalid::PrepareError;

pub use format::{parse, ParsedCall, ParsedOutput};
pub use stream::{CallDelta, CallStream};

/// How a model writes tool calls (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Generic,
    Hermes,
    Llama3,
    Mistral,
}

impl ToolFormat {
    /// The format a chat template writes tool calls in.
    pub fn detect(template: Option<&str>) -> ToolFormat {
        let Some(t) = template else {
            return ToolFormat::Generic;
        };
        if t.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if t.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if t.contains("<|python_tag|>") || (t.contains("ipython") && t.contains("tools")) {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    /// Whether the template itself renders `tools` (all but the generic format).
    pub fn native(self) -> bool {
        self != ToolFormat::Generic
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Generic => "generic",
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::Mistral => "mistral",
        }
    }
}

/// What `tool_choice` asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// A request's tools, checked: how the model is told and how its answer is read.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    pub format: ToolFormat,
    pub choice: Choice,
    pub parallel: bool,
    pub tools: Vec<Tool>,
}

/// Most tools one request may carry.
pub const MAX_TOOLS: usize = 128;

fn check_tool(i: usize, t: &Tool, earlier: &[Tool]) -> Result<(), PrepareError> {
    let at = |f: &str| format!("tools[{i}].{f}");
    if t.kind != "function" {
        return Err(PrepareError::new(
            at("type"),
            format!("only function tools are supported, got '{}'", t.kind),
        ));
    }
    let n = &t.function.name;
    let ok = !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !ok {
        return Err(PrepareError::new(
            at("function.name"),
            format!("'{n}' is not a valid function name (a-z, A-Z, 0-9, _ and -, at most 64)"),
        ));
    }
    if earlier.iter().any(|o| &o.function.name == n) {
        return Err(PrepareError::new(
            at("function.name"),
            format!("two tools are named '{n}'"),
        ));
    }
    if t.function
        .parameters
        .as_ref()
        .is_some_and(|p| !p.is_object())
    {
        return Err(PrepareError::new(
            at("function.parameters"),
            "parameters must be a JSON Schema object",
        ));
    }
    Ok(())
}

fn choice_of(choice: Option<&ToolChoice>, tools: &[Tool]) -> Result<Choice, PrepareError> {
    let c = match choice {
        None if tools.is_empty() => Choice::None,
        None => Choice::Auto,
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(PrepareError::new(
                    "tool_choice",
                    format!(
                    "tool_choice must be none, auto, required or a named function, got '{other}'"
                ),
                ))
            }
        },
        Some(ToolChoice::Named(n)) => Choice::Named(n.function.name.clone()),
    };
    if tools.is_empty() && c != Choice::None {
        return Err(PrepareError::new(
            "tool_choice",
            "tool_choice needs tools to choose from",
        ));
    }
    if let Choice::Named(n) = &c {
        if !tools.iter().any(|t| &t.function.name == n) {
            return Err(PrepareError::new(
                "tool_choice",
                format!("tool_choice names '{n}', which is not among the tools"),
            ));
        }
    }
    Ok(c)
}

/// Checks `tools` and `tool_choice`; `None` when no tool may be called.
pub fn tool_use(
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    parallel: Option<bool>,
    format: ToolFormat,
) -> Result<Option<ToolUse>, PrepareError> {
    let tools = tools.unwrap_or_default();
    if tools.len() > MAX_TOOLS {
        return Err(
            PrepareError::new("tools", format!("at most {MAX_TOOLS} tools"))
                .beyond(MAX_TOOLS, tools.len()),
        );
    }
    for (i, t) in tools.iter().enumerate() {
        check_tool(i, t, &tools[..i])?;
    }
    let choice = choice_of(choice, tools)?;
    if choice == Choice::None {
        return Ok(None);
    }
    Ok(Some(ToolUse {
        format,
        choice,
        parallel: parallel.unwrap_or(true),
        tools: tools.to_vec(),
    }))
}

impl ToolUse {
    /// The tools callable under the choice.
    fn callable(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().filter(move |t| match &self.choice {
            Choice::Named(n) => &t.function.name == n,
            _ => true,
        })
    }

    fn forced(&self) -> bool {
        matches!(self.choice, Choice::Required | Choice::Named(_))
    }

    /// One call of any callable tool, its arguments under the tool's schema; `args` is the
    /// format's name for them (`arguments`, or `parameters` for Llama 3).
    fn call_schema(&self, args: &str) -> Value {
        let mut one: Vec<Value> = self
            .callable()
            .map(|t| {
                let params = t
                    .function
                    .parameters
                    .clone()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
                json!({
                    "type": "object",
                    "properties": {"name": {"const": t.function.name}, args: params},
                    "required": ["name", args],
                    "additionalProperties": false
                })
            })
            .collect();
        if one.len() == 1 {
            one.remove(0)
        } else {
            json!({ "anyOf": one })
        }
    }

    fn calls_schema(&self) -> Value {
        let mut a = json!({"type": "array", "items": self.call_schema("arguments"), "minItems": 1});
        if !self.parallel {
            a["maxItems"] = json!(1);
        }
        a
    }

    /// The grammar the answer must match (`None`: free text, parsed afterwards). `response`
    /// is the schema of a direct answer in the generic format (a string by default).
    pub fn grammar(&self, response: Option<Value>) -> Option<Grammar> {
        match self.format {
            ToolFormat::Generic => {
                let calls = json!({
                    "type": "object",
                    "properties": {"tool_calls": self.calls_schema()},
                    "required": ["tool_calls"],
                    "additionalProperties": false
                });
                if self.forced() {
                    return Some(Grammar::JsonSchema(calls));
                }
                let response = response.unwrap_or_else(|| json!({"type": "string"}));
                let answer = json!({
                    "type": "object",
                    "properties": {"response": response},
                    "required": ["response"],
                    "additionalProperties": false
                });
                Some(Grammar::JsonSchema(json!({"anyOf": [calls, answer]})))
            }
            _ if !self.forced() => None,
            ToolFormat::Hermes => {
                let mut call = self.call_schema("arguments");
                close_objects(&mut call);
                let call = with_json_options(call).to_string();
                let start = if self.parallel {
                    "start: block (\"\\n\" block)*"
                } else {
                    "start: block"
                };
                Some(Grammar::Lark(format!(
                    "{start}\nblock: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {call}\n"
                )))
            }
            ToolFormat::Llama3 => Some(Grammar::JsonSchema(self.call_schema("parameters"))),
            ToolFormat::Mistral => Some(Grammar::JsonSchema(self.calls_schema())),
        }
    }

    /// The system message abserve adds for the generic format.
    pub fn generic_instructions(&self) -> String {
        let tools: Vec<Value> = self
            .callable()
            .map(|t| {
                json!({
                    "name": t.function.name,
                    "description": t.function.description.clone().unwrap_or_default(),
                    "parameters": t.function.parameters.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                })
            })
            .collect();
        let list = serde_json::to_string_pretty(&tools).unwrap_or_default();
        let call = "{\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}]}";
        if self.forced() {
            format!("You can call these tools:\n{list}\n\nAnswer with one JSON object that calls them: {call}")
        } else {
            format!("You can call these tools:\n{list}\n\nAnswer with one JSON object: {call} to call tools, or {{\"response\": <your answer>}} to answer directly.")
        }
    }
}

#[cfg(test)]
mod tests;
