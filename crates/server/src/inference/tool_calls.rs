//! A chat answer with tools, as OpenAI writes it: the model's text read by its tool format
//! (`abserve_engine::tools`) into `message.tool_calls` (ids `call_…`, arguments as JSON text,
//! as the model wrote them) and the content left over, `finish_reason` `tool_calls` when a
//! finished answer called tools. Streamed ([`Streamed`]): each call's first chunk carries its id
//! and name as soon as the name is whole, the next ones its arguments as the model writes them;
//! content is sent when the choice finishes (a tool answer is known to be content only then).

use abserve_engine::tools::{parse, CallDelta, CallStream, ParsedOutput, ToolUse};
use abserve_protocol::wire::{ChunkChoice, Delta, ResponseMessage};
use abserve_protocol::{FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta};

fn call_id() -> String {
    format!("call_{:016x}", rand::random::<u64>())
}

/// `tool_calls` replaces `stop` when a finished answer called tools.
fn finish_reason(called: bool, finish: &str) -> String {
    if called && finish == "stop" {
        "tool_calls".into()
    } else {
        finish.into()
    }
}

/// The assistant message of `text` and its finish reason.
pub(crate) fn message(tools: &ToolUse, text: &str, finish: &str) -> (ResponseMessage, String) {
    let parsed = parse(tools.format, text);
    let called = !parsed.calls.is_empty();
    let calls: Vec<ToolCall> = parsed
        .calls
        .into_iter()
        .map(|c| ToolCall {
            id: call_id(),
            kind: "function".into(),
            function: FunctionCall {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect();
    let m = ResponseMessage {
        role: "assistant".into(),
        content: parsed.content,
        tool_calls: (!calls.is_empty()).then_some(calls),
    };
    (m, finish_reason(called, finish))
}

/// One streamed choice with tools: its calls as they are written.
pub(crate) struct Streamed {
    index: u32,
    calls: CallStream,
    ids: Vec<String>,
}

impl Streamed {
    pub(crate) fn new(tools: &ToolUse, index: u32) -> Streamed {
        Streamed {
            index,
            calls: CallStream::new(tools.format),
            ids: Vec::new(),
        }
    }

    fn choice(&self, delta: Delta) -> ChunkChoice {
        ChunkChoice {
            index: self.index,
            delta: Some(delta),
            ..Default::default()
        }
    }

    fn chunks(&mut self, deltas: Vec<CallDelta>) -> Vec<ChunkChoice> {
        let mut out = Vec::new();
        for d in deltas {
            let d = match d {
                CallDelta::Head { index, name } => {
                    let id = call_id();
                    self.ids.push(id.clone());
                    ToolCallDelta {
                        index: index as u32,
                        id: Some(id),
                        kind: Some("function".into()),
                        function: FunctionCallDelta {
                            name: Some(name),
                            arguments: Some(String::new()),
                        },
                    }
                }
                CallDelta::Arguments { index, text } => ToolCallDelta {
                    index: index as u32,
                    function: FunctionCallDelta {
                        name: None,
                        arguments: Some(text),
                    },
                    ..Default::default()
                },
            };
            out.push(self.choice(Delta {
                tool_calls: Some(vec![d]),
                ..Default::default()
            }));
        }
        out
    }

    /// The chunk choices `piece` of the answer makes sendable now.
    pub(crate) fn push(&mut self, piece: &str) -> Vec<ChunkChoice> {
        let d = self.calls.push(piece);
        self.chunks(d)
    }

    /// The last chunk choices: the rest of the calls or the content, then the finish reason.
    pub(crate) fn finish(&mut self, tail: &str, finish: &str) -> Vec<ChunkChoice> {
        let mut out = self.push(tail);
        let (ParsedOutput { content, calls }, rest) = self.calls.finish();
        // a call cut short was streamed as far as it went: its text is not content as well
        let content = content.filter(|_| !calls.is_empty() || !self.calls.started());
        if let Some(content) = content {
            out.push(self.choice(Delta {
                content: Some(content),
                ..Default::default()
            }));
        }
        out.extend(self.chunks(rest));
        let mut last = self.choice(Delta::default());
        last.finish_reason = Some(finish_reason(!calls.is_empty(), finish));
        out.push(last);
        out
    }
}
