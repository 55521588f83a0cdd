//! A chat answer with tools, as OpenAI writes it: the model's text read by its tool format
//! (`abserve_engine::tools::parse`) into `message.tool_calls` (ids `call_…`, arguments as JSON
//! text) and the content left over, `finish_reason` `tool_calls` when a finished answer called
//! tools; streamed, each call as `delta.tool_calls` chunks (the first with its id and name, the
//! next with its arguments), sent when the choice finishes (a call is known only once whole).

use abserve_engine::tools::{parse, ToolUse};
use abserve_protocol::wire::{ChunkChoice, Delta, ResponseMessage};
use abserve_protocol::{FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta};

/// The assistant message of `text` and its finish reason (`tool_calls` replaces `stop`).
pub(crate) fn message(tools: &ToolUse, text: &str, finish: &str) -> (ResponseMessage, String) {
    let parsed = parse(tools.format, text);
    let calls: Vec<ToolCall> = parsed
        .calls
        .into_iter()
        .map(|c| ToolCall {
            id: format!("call_{:016x}", rand::random::<u64>()),
            kind: "function".into(),
            function: FunctionCall {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect();
    let finish = if !calls.is_empty() && finish == "stop" {
        "tool_calls".to_string()
    } else {
        finish.to_string()
    };
    let m = ResponseMessage {
        role: "assistant".into(),
        content: parsed.content,
        tool_calls: (!calls.is_empty()).then_some(calls),
    };
    (m, finish)
}

/// The chunk choices of a finished streamed choice `index` whose whole text is `text`: its
/// content or its calls, then the finish reason.
pub(crate) fn chunks(tools: &ToolUse, index: u32, text: &str, finish: &str) -> Vec<ChunkChoice> {
    let (m, finish) = message(tools, text, finish);
    let choice = |delta: Delta| ChunkChoice {
        index,
        delta: Some(delta),
        ..Default::default()
    };
    let mut out = Vec::new();
    if let Some(content) = m.content {
        out.push(choice(Delta {
            content: Some(content),
            ..Default::default()
        }));
    }
    for (k, c) in m.tool_calls.unwrap_or_default().into_iter().enumerate() {
        let head = ToolCallDelta {
            index: k as u32,
            id: Some(c.id),
            kind: Some("function".into()),
            function: FunctionCallDelta {
                name: Some(c.function.name),
                arguments: Some(String::new()),
            },
        };
        let args = ToolCallDelta {
            index: k as u32,
            function: FunctionCallDelta {
                name: None,
                arguments: Some(c.function.arguments),
            },
            ..Default::default()
        };
        for d in [head, args] {
            out.push(choice(Delta {
                tool_calls: Some(vec![d]),
                ..Default::default()
            }));
        }
    }
    let mut last = choice(Delta::default());
    last.finish_reason = Some(finish);
    out.push(last);
    out
}
