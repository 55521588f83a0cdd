//! Turns a stream of token pieces (raw bytes) into text that is safe to stream: whole UTF-8
//! characters only, and nothing that might turn out to be the start of a stop string.
//!
//! A token can end in the middle of a multi-byte character, and a stop string can span several
//! tokens; both mean text must sometimes be held back for a step. When a stop string is found,
//! the text before it is released and the sequence ends; the stop string itself is not returned,
//! as in OpenAI's API.

#[derive(Debug, Default)]
pub struct TextStream {
    stops: Vec<String>,
    /// Bytes not yet valid UTF-8 (a character split across tokens).
    pending_bytes: Vec<u8>,
    /// Decoded text not yet released because it may begin a stop string.
    held: String,
    /// Everything released so far.
    pub emitted: String,
}

#[derive(Debug, PartialEq)]
pub struct Push {
    pub text: String,
    pub stopped: bool,
}

impl TextStream {
    pub fn new(stops: Vec<String>) -> Self {
        TextStream {
            stops,
            ..Default::default()
        }
    }

    pub fn push(&mut self, piece: &[u8]) -> Push {
        self.pending_bytes.extend_from_slice(piece);
        let valid = match std::str::from_utf8(&self.pending_bytes) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // invalid bytes that can never become valid: replace them
            Err(_) => {
                let s = String::from_utf8_lossy(&self.pending_bytes).into_owned();
                self.pending_bytes.clear();
                self.held.push_str(&s);
                return self.release();
            }
        };
        // valid UTF-8 up to `valid` (checked above): the lossy conversion replaces nothing
        let s = String::from_utf8_lossy(&self.pending_bytes[..valid]).into_owned();
        self.pending_bytes.drain(..valid);
        self.held.push_str(&s);
        self.release()
    }

    fn release(&mut self) -> Push {
        // earliest full stop match
        let mut cut: Option<usize> = None;
        for st in &self.stops {
            // search in emitted tail + held so that matches spanning the boundary count; only the
            // held part is searched because emitted text never contains a stop prefix at its end.
            if let Some(i) = self.held.find(st.as_str()) {
                cut = Some(cut.map_or(i, |c: usize| c.min(i)));
            }
        }
        if let Some(i) = cut {
            let text: String = self.held[..i].to_owned();
            self.held.clear();
            self.emitted.push_str(&text);
            return Push {
                text,
                stopped: true,
            };
        }
        // hold back the longest suffix of `held` that is a proper prefix of some stop string
        let mut hold = 0;
        for st in &self.stops {
            for (end, _) in st
                .char_indices()
                .skip(1)
                .chain(std::iter::once((st.len(), ' ')))
            {
                let prefix = &st[..end];
                if prefix.len() < st.len() && self.held.ends_with(prefix) {
                    hold = hold.max(prefix.len());
                }
            }
        }
        let split = self.held.len() - hold;
        let text: String = self.held[..split].to_owned();
        self.held.drain(..split);
        self.emitted.push_str(&text);
        Push {
            text,
            stopped: false,
        }
    }

    /// At the end of a sequence: release whatever was held back.
    pub fn finish(&mut self) -> String {
        let mut rest = std::mem::take(&mut self.held);
        if !self.pending_bytes.is_empty() {
            rest.push_str(&String::from_utf8_lossy(&self.pending_bytes));
            self.pending_bytes.clear();
        }
        self.emitted.push_str(&rest);
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_utf8_across_tokens() {
        let mut t = TextStream::new(vec![]);
        let e = "é".as_bytes();
        assert_eq!(t.push(&e[..1]).text, "");
        assert_eq!(t.push(&e[1..]).text, "é");
        assert_eq!(t.finish(), "");
        assert_eq!(t.emitted, "é");
    }

    #[test]
    fn stop_string_across_tokens_is_cut() {
        let mut t = TextStream::new(vec!["\n\nUser".into()]);
        assert_eq!(t.push(b"Hello").text, "Hello");
        let p = t.push(b"\n\n");
        assert_eq!(
            p,
            Push {
                text: String::new(),
                stopped: false
            }
        );
        let p = t.push(b"Us");
        assert!(!p.stopped);
        let p = t.push(b"er: hi");
        assert_eq!(
            p,
            Push {
                text: String::new(),
                stopped: true
            }
        );
        assert_eq!(t.emitted, "Hello");
    }

    #[test]
    fn held_text_is_released_when_not_a_stop() {
        let mut t = TextStream::new(vec!["END".into()]);
        assert_eq!(t.push(b"the E").text, "the ");
        assert_eq!(t.push(b"ND").text, "");
        let mut t = TextStream::new(vec!["END".into()]);
        t.push(b"the E");
        assert_eq!(t.push(b"gg").text, "Egg");
        assert_eq!(t.finish(), "");
    }

    #[test]
    fn earliest_stop_wins() {
        let mut t = TextStream::new(vec!["b".into(), "a".into()]);
        let p = t.push(b"xxaby");
        assert_eq!(
            p,
            Push {
                text: "xx".into(),
                stopped: true
            }
        );
    }
}
