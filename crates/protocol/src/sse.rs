//! Server-sent events, as OpenAI-compatible servers stream them: `data: <json>` lines separated
//! by blank lines, `data: [DONE]` at the end.
//!
//! One behaviour everywhere: bytes may arrive split anywhere (inside a line, inside a UTF-8
//! character); `\n` and `\r\n` both end a line; comment lines (`: ping`), blank lines and other
//! fields (`event:`, `id:`, `retry:`) are skipped; each `data:` line is one event, given out as
//! soon as its line ends (OpenAI-compatible servers send one JSON document per `data:` line, so
//! multi-line data is not joined). What the data holds is the caller's business:
//! [`crate::Client`] treats data that is not a JSON chunk as an error, never skips it.

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// The payload of a `data:` line.
    Data(String),
    /// `data: [DONE]`: the stream is complete.
    Done,
}

#[derive(Debug, Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
}

impl SseDecoder {
    pub fn new() -> Self {
        SseDecoder::default()
    }

    /// Feeds bytes as they arrive; returns the events completed by them, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            if let Some(e) = Self::line(&line) {
                out.push(e);
            }
        }
        out
    }

    /// Whatever is left when the connection closes (a last line without its newline).
    pub fn finish(&mut self) -> Option<SseEvent> {
        let rest = std::mem::take(&mut self.buf);
        Self::line(&rest)
    }

    fn line(raw: &[u8]) -> Option<SseEvent> {
        let line = String::from_utf8_lossy(raw);
        let line = line.trim_end_matches(['\n', '\r']);
        let data = line.strip_prefix("data:")?;
        let data = data.strip_prefix(' ').unwrap_or(data);
        if data.trim() == "[DONE]" {
            return Some(SseEvent::Done);
        }
        if data.trim().is_empty() {
            return None;
        }
        Some(SseEvent::Data(data.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let mut d = SseDecoder::new();
        let mut out: Vec<SseEvent> = chunks.iter().flat_map(|c| d.feed(c)).collect();
        out.extend(d.finish());
        out
    }

    #[test]
    fn events_split_anywhere_give_the_same_result() {
        let text = "data: {\"a\":1}\n\ndata: {\"b\":\"é\"}\r\n\r\ndata: [DONE]\n\n".as_bytes();
        let whole = all(&[text]);
        assert_eq!(
            whole,
            vec![
                SseEvent::Data("{\"a\":1}".into()),
                SseEvent::Data("{\"b\":\"é\"}".into()),
                SseEvent::Done
            ]
        );
        for cut in 1..text.len() {
            assert_eq!(
                all(&[&text[..cut], &text[cut..]]),
                whole,
                "cut at byte {cut}"
            );
        }
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(
            all(&bytes),
            whole,
            "one byte at a time (a UTF-8 character split too)"
        );
    }

    #[test]
    fn comments_and_other_fields_are_skipped() {
        let text = b": keep-alive\nevent: message\nid: 7\nretry: 100\ndata:{\"x\":2}\n\n";
        assert_eq!(all(&[text]), vec![SseEvent::Data("{\"x\":2}".into())]);
    }

    #[test]
    fn a_last_line_without_newline_still_counts_and_bad_json_is_passed_on() {
        assert_eq!(
            all(&[b"data: not json"]),
            vec![SseEvent::Data("not json".into())]
        );
        assert_eq!(all(&[b"data: [DONE]"]), vec![SseEvent::Done]);
        assert_eq!(all(&[b"data:\n\n", b"\n"]), vec![]);
    }
}
