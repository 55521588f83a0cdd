//! The compiler and the matcher on a small JSON-ish vocabulary tokenized by greedy longest
//! match: masks, forced tokens, limits and errors named by field.

use super::*;

/// Single characters of JSON plus a few longer pieces; token 0 is `<unk>`, 1 the EOS.
pub(crate) fn json_vocab() -> Vocab {
    json_vocab_of(0)
}

/// [`json_vocab`] padded with special tokens to `n` tokens (the scheduler's fake has 100).
pub(crate) fn json_vocab_of(n: usize) -> Vocab {
    let mut tokens = vec![
        TokenBytes {
            bytes: b"<unk>".to_vec(),
            special: true,
        },
        TokenBytes {
            bytes: b"<eos>".to_vec(),
            special: true,
        },
    ];
    // digits first (ids 2–11), then lower-case letters, then every other printable byte and \n
    let mut singles: Vec<u8> = b"0123456789abcdefghijklmnopqrstuvwxyz".to_vec();
    singles.extend((b' '..=b'~').filter(|b| !b.is_ascii_digit() && !b.is_ascii_lowercase()));
    singles.push(b'\n');
    tokens.extend(singles.iter().map(|&b| TokenBytes {
        bytes: vec![b],
        special: false,
    }));
    for p in [
        "{\"", "\": ", ", \"", "true", "false", "null", "name", "age", "\"}",
    ] {
        tokens.push(TokenBytes {
            bytes: p.as_bytes().to_vec(),
            special: false,
        });
    }
    while tokens.len() < n {
        tokens.push(TokenBytes {
            bytes: format!("<pad{}>", tokens.len()).into_bytes(),
            special: true,
        });
    }
    Vocab::greedy(tokens, vec![1])
}

fn grammars() -> Grammars {
    Grammars::new(json_vocab(), Default::default()).unwrap()
}

fn text_of(v: &Vocab, toks: &[i32]) -> String {
    toks.iter()
        .map(|&t| String::from_utf8_lossy(&v.tokens[t as usize].bytes).into_owned())
        .collect()
}

/// Runs a constraint to its end, always taking the allowed token with the lowest id except EOS
/// (so forced tokens and masks are exercised), and returns the tokens.
fn walk(c: &mut Constraint, fast_forward: bool) -> Vec<i32> {
    walk_by(c, fast_forward, Pick::Lowest)
}

pub(crate) enum Pick {
    Lowest,
    /// The token with the most closing bytes (`"`, `}`, `]`), lowest id on ties.
    Closing,
}

/// The allowed token (EOS excepted) that `pick` prefers, under `mask`.
pub(crate) fn choose(mask: &SimpleVob, pick: &Pick, v: &Vocab) -> Option<u32> {
    let ok = |t: &u32| *t != 1 && mask.is_allowed(*t);
    let n = mask.len() as u32;
    match pick {
        Pick::Lowest => (0..n).find(ok),
        Pick::Closing => (0..n).filter(ok).max_by_key(|&t| {
            let closing = v.tokens[t as usize]
                .bytes
                .iter()
                .filter(|b| matches!(b, b'"' | b'}' | b']'))
                .count();
            (closing, std::cmp::Reverse(t))
        }),
    }
}

fn walk_by(c: &mut Constraint, fast_forward: bool, pick: Pick) -> Vec<i32> {
    let v = json_vocab();
    let mut out = Vec::new();
    for _ in 0..200 {
        if c.is_stopped() {
            break;
        }
        let mask = c.mask().unwrap();
        let pick = choose(&mask, &pick, &v).or_else(|| mask.is_allowed(1).then_some(1));
        let Some(t) = pick else { break };
        if t == 1 {
            break;
        }
        c.commit(t as i32).unwrap();
        out.push(t as i32);
        if fast_forward {
            out.extend(c.forced(1000));
        }
    }
    out
}

#[test]
fn a_schema_walk_is_valid_json_and_forced_tokens_change_nothing() {
    let g = grammars();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 3}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": false
    });
    let grammar = Grammar::JsonSchema(schema);
    let mut a = g.compile(&grammar, "response_format").unwrap();
    let mut b = a.clone();
    let with_ff = walk(&mut a, true);
    let without = walk(&mut b, false);
    assert_eq!(with_ff, without, "fast-forward changed the tokens");
    let v = json_vocab();
    let text = text_of(&v, &with_ff);
    let value: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert!(value["name"].is_string() && value["age"].is_i64(), "{text}");
    assert!(text.starts_with("{\"name\": \""), "{text}");
}

#[test]
fn the_first_token_of_a_forced_prefix_is_the_only_one_allowed() {
    let g = grammars();
    let mut c = g
        .compile(&Grammar::Regex("abc[0-9]+".into()), "response_format")
        .unwrap();
    let mask = c.mask().unwrap();
    assert_eq!(mask.num_set(), 1, "a forced prefix allows one token");
    let forced = c.forced(10);
    let v = json_vocab();
    assert_eq!(text_of(&v, &forced), "abc");
    // EOS only once the regex may end
    let mask = c.mask().unwrap();
    assert!(!mask.is_allowed(1));
    c.commit(2 + 7).unwrap(); // '7'
    assert!(c.mask().unwrap().is_allowed(1) && c.is_accepting());
}

#[test]
fn bad_grammars_are_errors_naming_the_field() {
    let g = grammars();
    for bad in [
        Grammar::Regex("(".into()),
        Grammar::Lark("start: undefined_rule".into()),
        Grammar::JsonSchema(serde_json::json!({"type": "object", "properties": 3})),
    ] {
        let e = g.compile(&bad, "response_format").unwrap_err();
        assert_eq!(e.field, "response_format");
        assert!(
            e.message.contains("does not compile") || e.message.contains("allows no answer"),
            "{}",
            e.message
        );
    }
}

#[test]
fn a_lark_grammar_and_any_json_object_compile() {
    let g = grammars();
    let mut c = g
        .compile(
            &Grammar::Lark("start: \"yes\" | \"no\"".into()),
            "response_format",
        )
        .unwrap();
    let toks = walk(&mut c, true);
    let t = text_of(&json_vocab(), &toks);
    assert!(t == "yes" || t == "no", "{t}");
    let mut c = g.compile(&Grammar::JsonObject, "response_format").unwrap();
    // the lowest token would write one key forever: prefer the tokens that close things
    let toks = walk_by(&mut c, true, Pick::Closing);
    let t = text_of(&json_vocab(), &toks);
    assert!(
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&t).is_ok(),
        "{t}"
    );
}

#[test]
fn listed_objects_are_closed_unless_the_schema_says_otherwise() {
    let mut s = serde_json::json!({
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "open": {"type": "object", "properties": {"y": {}}, "additionalProperties": true},
            "list": {"type": "array", "items": {"properties": {"z": {}}}},
            "any": {"type": "object"}
        },
        "$defs": {"d": {"properties": {"w": {}}}},
        "anyOf": [{"properties": {"v": {}}}],
    });
    close_objects(&mut s);
    assert_eq!(s["additionalProperties"], false);
    let p = &s["properties"];
    assert!(
        p.get("additionalProperties").is_none(),
        "a property named 'properties' is data"
    );
    assert_eq!(p["properties"]["additionalProperties"], false);
    assert_eq!(p["open"]["additionalProperties"], true);
    assert_eq!(p["list"]["items"]["additionalProperties"], false);
    assert!(
        p["any"].get("additionalProperties").is_none(),
        "an object without properties stays open"
    );
    assert_eq!(s["$defs"]["d"]["additionalProperties"], false);
    assert_eq!(s["anyOf"][0]["additionalProperties"], false);
    let mut all =
        serde_json::json!({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]});
    let before = all.clone();
    close_objects(&mut all);
    assert_eq!(all, before, "allOf is left as written");
}

#[test]
fn a_matcher_counts_its_lexer_tables_and_they_grow_with_what_it_sees() {
    let g = grammars();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^[a-z]+[0-9]*$"},
                       "age": {"type": "integer"}},
        "required": ["name", "age"]
    });
    let mut c = g
        .compile(&Grammar::JsonSchema(schema), "response_format")
        .unwrap();
    let fresh = c.bytes();
    assert!(fresh > 0, "a compiled matcher holds lexer tables");
    walk(&mut c, false);
    assert!(
        c.bytes() > fresh,
        "the lexer's tables grew as states were explored: {fresh} -> {}",
        c.bytes()
    );
}
