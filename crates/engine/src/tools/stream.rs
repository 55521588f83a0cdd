//! Tool calls read while the answer streams, as OpenAI streams them: a call's name as soon as
//! it is whole, then its arguments piece by piece as the model writes them.
//!
//! Invariants: the pieces of a call's arguments are consecutive slices of the answer's text,
//! so joined they are a prefix of the arguments [`parse`](super::parse) reads from the whole
//! answer (which keeps them as written); [`CallStream::finish`] sends what is left, so the
//! deltas of each call join into exactly that call. Calls are announced in order, each once.
//! Arguments written as a JSON string (not an object) are held and sent whole at the end.
//! Text that is not a call (content) is not streamed here: it is sent when the answer ends.

use super::{parse, ParsedOutput, ToolFormat};

/// What to send for a call now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallDelta {
    /// Call `index` starts: its function's name.
    Head { index: usize, name: String },
    /// More of call `index`'s arguments.
    Arguments { index: usize, text: String },
}

/// One call as far as the text goes.
#[derive(Debug, PartialEq)]
struct Partial {
    name: Option<String>,
    /// Where its arguments object starts in the text, and where it ends when whole.
    args: Option<(usize, Option<usize>)>,
}

/// The calls of one streamed answer and what of them was sent.
#[derive(Debug)]
pub struct CallStream {
    format: ToolFormat,
    text: String,
    /// Per call announced: the bytes of its arguments sent.
    sent: Vec<usize>,
}

impl CallStream {
    pub fn new(format: ToolFormat) -> CallStream {
        CallStream {
            format,
            text: String::new(),
            sent: Vec::new(),
        }
    }

    /// The answer so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether any call was announced.
    pub fn started(&self) -> bool {
        !self.sent.is_empty()
    }

    /// Adds `piece` to the answer and returns what can be sent now.
    pub fn push(&mut self, piece: &str) -> Vec<CallDelta> {
        self.text.push_str(piece);
        let calls = scan(self.format, &self.text);
        let mut out = Vec::new();
        for (index, c) in calls.into_iter().enumerate() {
            if index == self.sent.len() {
                let Some(name) = c.name else { break };
                out.push(CallDelta::Head { index, name });
                self.sent.push(0);
            }
            let Some((start, end)) = c.args else { continue };
            let end = end.unwrap_or(self.text.len());
            let from = start + self.sent[index];
            if end > from {
                out.push(CallDelta::Arguments {
                    index,
                    text: self.text[from..end].to_string(),
                });
                self.sent[index] = end - start;
            }
        }
        out
    }

    /// The whole answer read, and what is left to send so that each call's deltas join into
    /// the call as read. A call announced that the whole answer does not hold (it was cut by
    /// `max_tokens`) stays as streamed.
    pub fn finish(&mut self) -> (ParsedOutput, Vec<CallDelta>) {
        let parsed = parse(self.format, &self.text);
        let mut out = Vec::new();
        for (index, c) in parsed.calls.iter().enumerate() {
            if index == self.sent.len() {
                out.push(CallDelta::Head {
                    index,
                    name: c.name.clone(),
                });
                self.sent.push(0);
            }
            let sent = self.sent[index];
            if let Some(rest) = c.arguments.get(sent..).filter(|r| !r.is_empty()) {
                out.push(CallDelta::Arguments {
                    index,
                    text: rest.to_string(),
                });
            }
        }
        (parsed, out)
    }
}

/// The calls in `text` (possibly cut anywhere) in `format`.
fn scan(format: ToolFormat, text: &str) -> Vec<Partial> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    match format {
        ToolFormat::Generic => {
            let i = ws(b, 0);
            if b.get(i) != Some(&b'{') {
                return out;
            }
            let i = ws(b, i + 1);
            let Some(k) = string_end(b, i) else {
                return out;
            };
            if &text[i..k] != "\"tool_calls\"" {
                return out;
            }
            let i = ws(b, k);
            if b.get(i) == Some(&b':') {
                array(text, ws(b, i + 1), &mut out);
            }
        }
        ToolFormat::Hermes => {
            const OPEN: &str = "<tool_call>";
            let mut from = 0;
            while let Some(at) = text[from..].find(OPEN) {
                let start = from + at + OPEN.len();
                let (c, end) = call(text, ws(b, start));
                out.extend(c);
                match (end, text[start..].find("</tool_call>")) {
                    (Some(_), Some(close)) => from = start + close,
                    _ => break,
                }
            }
        }
        ToolFormat::Llama3 | ToolFormat::Mistral => {
            let mut i = ws(b, 0);
            for marker in ["<|python_tag|>", "[TOOL_CALLS]"] {
                if text[i..].starts_with(marker) {
                    i = ws(b, i + marker.len());
                }
            }
            match b.get(i) {
                Some(b'[') => array(text, i, &mut out),
                Some(b'{') => out.extend(call(text, i).0),
                _ => {}
            }
        }
    }
    out
}

/// The calls of an array starting at `i`.
fn array(text: &str, i: usize, out: &mut Vec<Partial>) {
    let b = text.as_bytes();
    if b.get(i) != Some(&b'[') {
        return;
    }
    let mut i = ws(b, i + 1);
    loop {
        let (c, end) = call(text, i);
        out.extend(c);
        let Some(end) = end else { return };
        i = ws(b, end);
        if b.get(i) != Some(&b',') {
            return;
        }
        i = ws(b, i + 1);
    }
}

/// The call object starting at `i` as far as it goes, and the end of the object when whole.
fn call(text: &str, i: usize) -> (Option<Partial>, Option<usize>) {
    let b = text.as_bytes();
    if b.get(i) != Some(&b'{') {
        return (None, None);
    }
    let mut c = Partial {
        name: None,
        args: None,
    };
    let mut i = ws(b, i + 1);
    loop {
        if b.get(i) == Some(&b'}') {
            return (Some(c), Some(i + 1));
        }
        let Some(k) = string_end(b, i) else {
            return (Some(c), None);
        };
        let key: String = serde_json::from_str(&text[i..k]).unwrap_or_default();
        let mut v = ws(b, k);
        if b.get(v) != Some(&b':') {
            return (Some(c), None);
        }
        v = ws(b, v + 1);
        let end = value_end(b, v);
        match key.as_str() {
            "name" => c.name = end.and_then(|e| serde_json::from_str(&text[v..e]).ok()),
            "arguments" | "parameters" if b.get(v) == Some(&b'{') => c.args = Some((v, end)),
            _ => {}
        }
        let Some(end) = end else {
            return (Some(c), None);
        };
        i = ws(b, end);
        match b.get(i) {
            Some(b',') => i = ws(b, i + 1),
            Some(b'}') => return (Some(c), Some(i + 1)),
            _ => return (Some(c), None),
        }
    }
}

fn ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
        i += 1;
    }
    i
}

/// The end of the string starting at `i` (after its closing quote), if it is whole.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// The end of the JSON value starting at `i`, if it is whole (a number or literal is whole
/// only once something follows it).
fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let j = (i..b.len())
                .find(|&j| matches!(b[j], b',' | b'}' | b']') || b[j].is_ascii_whitespace())?;
            Some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `answer` in pieces of `n` bytes (at char boundaries) and joins the deltas.
    fn joined(format: ToolFormat, answer: &str, n: usize) -> (Vec<(String, String)>, usize) {
        let mut s = CallStream::new(format);
        let mut calls: Vec<(String, String)> = Vec::new();
        let mut pieces_before_end = 0;
        let apply = |d: Vec<CallDelta>, calls: &mut Vec<(String, String)>| {
            for d in d {
                match d {
                    CallDelta::Head { index, name } => {
                        assert_eq!(index, calls.len(), "calls are announced in order");
                        calls.push((name, String::new()));
                    }
                    CallDelta::Arguments { index, text } => calls[index].1.push_str(&text),
                }
            }
        };
        let chars: Vec<char> = answer.chars().collect();
        for piece in chars.chunks(n) {
            let d = s.push(&piece.iter().collect::<String>());
            pieces_before_end += d
                .iter()
                .filter(|d| matches!(d, CallDelta::Arguments { .. }))
                .count();
            apply(d, &mut calls);
        }
        let (parsed, rest) = s.finish();
        apply(rest, &mut calls);
        let want: Vec<(String, String)> = parsed
            .calls
            .into_iter()
            .map(|c| (c.name, c.arguments))
            .collect();
        assert_eq!(
            calls, want,
            "the deltas join into the calls read from the whole answer"
        );
        (calls, pieces_before_end)
    }

    #[test]
    fn each_format_streams_names_then_arguments_that_join_into_the_parsed_calls() {
        let cases = [
            (
                ToolFormat::Generic,
                r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo, \"N\"}", "days": [1, 2]}}, {"name": "b", "arguments": {}}]}"#,
                2,
            ),
            (
                ToolFormat::Hermes,
                "Checking.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": {\"y\": 10}}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"z\": true}, \"name\": \"b\"}\n</tool_call>",
                2,
            ),
            (
                ToolFormat::Llama3,
                "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 12345}}",
                1,
            ),
            (
                ToolFormat::Mistral,
                "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": \"é ü\"}}]",
                1,
            ),
        ];
        for (format, answer, calls) in cases {
            for n in [1, 3, 7, 1000] {
                let (got, streamed) = joined(format, answer, n);
                assert_eq!(got.len(), calls, "{format:?} {answer}");
                if n == 1 {
                    assert!(
                        streamed > 3,
                        "{format:?}: arguments are streamed as they are written ({streamed} pieces)"
                    );
                }
            }
        }
    }

    #[test]
    fn content_and_arguments_in_a_string_are_held_to_the_end() {
        let (calls, streamed) = joined(ToolFormat::Generic, r#"{"response": "hello"}"#, 1);
        assert_eq!((calls.len(), streamed), (0, 0));
        let (calls, streamed) = joined(
            ToolFormat::Llama3,
            r#"{"name": "a", "parameters": "{\"x\": 1}"}"#,
            1,
        );
        assert_eq!(calls, [("a".to_string(), "{\"x\": 1}".to_string())]);
        assert_eq!(streamed, 0, "string arguments are sent whole at the end");
    }

    #[test]
    fn a_call_cut_short_stays_as_streamed() {
        let mut s = CallStream::new(ToolFormat::Generic);
        let d = s.push(r#"{"tool_calls": [{"name": "a", "arguments": {"x": 1"#);
        assert_eq!(
            d,
            [
                CallDelta::Head {
                    index: 0,
                    name: "a".into()
                },
                CallDelta::Arguments {
                    index: 0,
                    text: "{\"x\": 1".into()
                }
            ]
        );
        let (parsed, rest) = s.finish();
        assert!(parsed.calls.is_empty() && rest.is_empty() && s.started());
    }
}
