use super::*;
use abserve_protocol::Structure;

/// Bytes are tokens; the template writes `<s>` (the BOS text) first when `bos_in_template`.
struct Bytes {
    bos: Option<i32>,
    bos_in_template: bool,
}

impl Tokenizer for Bytes {
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        _tools: &[abserve_protocol::Tool],
    ) -> Result<String, ChatTemplateError> {
        let mut s = if self.bos_in_template {
            "\u{1}".to_string()
        } else {
            String::new()
        };
        for m in messages {
            s.push_str(&format!("{}: {}\n", m.role, m.content));
        }
        Ok(s)
    }
    fn tokenize(&self, text: &str) -> Vec<i32> {
        text.bytes().map(i32::from).collect()
    }
    fn bos(&self) -> Option<i32> {
        self.bos
    }
    fn n_vocab(&self) -> usize {
        256
    }
}

fn chat(tok: &Bytes) -> Vec<i32> {
    input_tokens(tok, Input::Chat(&[ChatMessage::new("user", "hi")])).unwrap()
}

#[test]
fn bos_comes_first_exactly_once_when_the_vocabulary_asks_for_it() {
    let plain = chat(&Bytes {
        bos: None,
        bos_in_template: false,
    });
    assert_eq!(plain, b"user: hi\n".map(i32::from));
    let wants = chat(&Bytes {
        bos: Some(1),
        bos_in_template: false,
    });
    assert_eq!(wants[0], 1);
    assert_eq!(wants[1..], plain[..]);
    // a template that writes the BOS itself: not a second one
    let written = chat(&Bytes {
        bos: Some(1),
        bos_in_template: true,
    });
    assert_eq!(written, wants);
    // the same rule for a text prompt; token ids are taken as sent
    let tok = Bytes {
        bos: Some(1),
        bos_in_template: false,
    };
    assert_eq!(input_tokens(&tok, Input::Text("ab")).unwrap(), [1, 97, 98]);
    assert_eq!(input_tokens(&tok, Input::Tokens(&[5, 6])).unwrap(), [5, 6]);
}

#[test]
fn the_context_clamps_an_unset_max_tokens_and_refuses_an_explicit_one_that_does_not_fit() {
    let tok = Bytes {
        bos: None,
        bos_in_template: false,
    };
    let limits = Limits::context(12);
    let p = prepare(
        &tok,
        Input::Text("abcd"),
        &Sampling::default(),
        &Structure::default(),
        &Options::new(100),
        limits,
    )
    .unwrap();
    assert_eq!((p.prompt.len(), p.params.max_tokens), (4, 8));
    let explicit = Sampling {
        max_tokens: Some(9),
        ..Default::default()
    };
    let e = prepare(
        &tok,
        Input::Text("abcd"),
        &explicit,
        &Structure::default(),
        &Options::new(100),
        limits,
    )
    .unwrap_err();
    assert_eq!(e.field, "max_tokens");
    assert_eq!(
        (e.limit.as_deref(), e.value.as_deref()),
        (Some("8"), Some("9"))
    );
    let e = prepare(
        &tok,
        Input::Text(&"x".repeat(12)),
        &Sampling::default(),
        &Structure::default(),
        &Options::new(1),
        limits,
    )
    .unwrap_err();
    assert_eq!(
        (e.field.as_str(), e.limit.as_deref()),
        ("prompt", Some("11"))
    );
    let e = prepare(
        &tok,
        Input::Tokens(&[]),
        &Sampling::default(),
        &Structure::default(),
        &Options::new(1),
        limits,
    )
    .unwrap_err();
    assert_eq!(e.field, "prompt");
}
