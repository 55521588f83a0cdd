//! Tool formats: detection from templates, the checks of `tools`/`tool_choice`, grammars that
//! compile and admit exactly a call, and parsing each format's text.

use abserve_protocol::{FunctionDef, NamedFunction, NamedTool, Tool, ToolChoice};
use serde_json::json;

use super::*;
use crate::grammar::tests::{choose, json_vocab, Pick};
use crate::grammar::Grammars;

fn weather() -> Tool {
    Tool {
        kind: "function".into(),
        function: FunctionDef {
            name: "get_weather".into(),
            description: Some("Weather in a city".into()),
            parameters: Some(json!({
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 3}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
                "additionalProperties": false
            })),
            strict: None,
        },
    }
}

fn mode(m: &str) -> Option<ToolChoice> {
    Some(ToolChoice::Mode(m.into()))
}

#[test]
fn formats_are_recognised_from_their_templates() {
    let qwen = "{%- if tools %}<tools>{{ tool | tojson }}</tools> ... <tool_call>\\n{\"name\": ...}</tool_call>{%- endif %}";
    let llama = "{%- if tools is not none %}Environment: ipython{%- endif %}<|python_tag|>";
    let mistral = "{%- if message.tool_calls %}[TOOL_CALLS][{{ ... }}]{%- endif %}";
    let chatml = "{% for message in messages %}<|im_start|>{{ message['role'] }}{% endfor %}";
    assert_eq!(ToolFormat::detect(Some(qwen)), ToolFormat::Hermes);
    assert_eq!(ToolFormat::detect(Some(llama)), ToolFormat::Llama3);
    assert_eq!(ToolFormat::detect(Some(mistral)), ToolFormat::Mistral);
    assert_eq!(ToolFormat::detect(Some(chatml)), ToolFormat::Generic);
    assert_eq!(ToolFormat::detect(None), ToolFormat::Generic);
}

#[test]
fn tools_and_tool_choice_are_checked_by_name() {
    let t = [weather()];
    let g = ToolFormat::Generic;
    assert!(tool_use(None, None, None, g).unwrap().is_none());
    assert!(tool_use(Some(&t), mode("none").as_ref(), None, g)
        .unwrap()
        .is_none());
    assert_eq!(
        tool_use(Some(&t), None, None, g).unwrap().unwrap().choice,
        Choice::Auto
    );
    let field = |tools: &[Tool], c: Option<ToolChoice>| {
        tool_use(Some(tools), c.as_ref(), None, g)
            .unwrap_err()
            .field
    };
    assert_eq!(field(&[], mode("required")), "tool_choice");
    assert_eq!(field(&t, mode("sometimes")), "tool_choice");
    let named = |n: &str| {
        Some(ToolChoice::Named(NamedTool {
            kind: "function".into(),
            function: NamedFunction { name: n.into() },
        }))
    };
    assert_eq!(field(&t, named("nope")), "tool_choice");
    let mut bad = weather();
    bad.function.name = "has space".into();
    assert_eq!(field(&[bad], None), "tools[0].function.name");
    assert_eq!(
        field(&[weather(), weather()], None),
        "tools[1].function.name"
    );
    let mut bad = weather();
    bad.kind = "retrieval".into();
    assert_eq!(field(&[bad], None), "tools[0].type");
    let mut bad = weather();
    bad.function.parameters = Some(json!(3));
    assert_eq!(field(&[bad], None), "tools[0].function.parameters");
}

/// Walks a grammar taking the lowest allowed token (EOS last), fast-forwarding forced tokens.
fn walk(g: &Grammars, grammar: &Grammar) -> String {
    walk_by(g, grammar, Pick::Lowest)
}

fn walk_by(g: &Grammars, grammar: &Grammar, pick: Pick) -> String {
    let v = json_vocab();
    let mut c = g.compile(grammar, "tools").unwrap();
    let mut out = String::new();
    for _ in 0..400 {
        if c.is_stopped() {
            break;
        }
        let m = c.mask().unwrap();
        let Some(t) = choose(&m, &pick, &v) else {
            break;
        };
        c.commit(t as i32).unwrap();
        out.push_str(&String::from_utf8_lossy(&v.tokens[t as usize].bytes));
        for f in c.forced(1000) {
            out.push_str(&String::from_utf8_lossy(&v.tokens[f as usize].bytes));
        }
    }
    out
}

#[test]
fn a_required_call_is_constrained_to_the_tools_schema_in_every_format() {
    let g = Grammars::new(json_vocab(), Default::default()).unwrap();
    let t = [weather()];
    for format in [
        ToolFormat::Generic,
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
    ] {
        let u = tool_use(Some(&t), mode("required").as_ref(), Some(false), format)
            .unwrap()
            .unwrap();
        let text = walk(&g, &u.grammar(None).unwrap());
        let parsed = parse(format, &text);
        assert_eq!(parsed.calls.len(), 1, "{format:?}: {text}");
        assert_eq!(parsed.calls[0].name, "get_weather");
        let args: serde_json::Value = serde_json::from_str(&parsed.calls[0].arguments).unwrap();
        assert!(
            args["city"].as_str().unwrap().len() <= 3
                && ["c", "f"].contains(&args["unit"].as_str().unwrap()),
            "{text}"
        );
    }
    // auto in the generic format: a call or a response, both JSON
    let u = tool_use(Some(&t), None, None, ToolFormat::Generic)
        .unwrap()
        .unwrap();
    let text = walk_by(&g, &u.grammar(None).unwrap(), Pick::Closing);
    assert!(
        serde_json::from_str::<serde_json::Value>(&text).is_ok(),
        "{text}"
    );
    assert!(tool_use(Some(&t), None, None, ToolFormat::Hermes)
        .unwrap()
        .unwrap()
        .grammar(None)
        .is_none());
}

#[test]
fn each_format_parses_its_calls_and_keeps_other_text_as_content() {
    let p = parse(
        ToolFormat::Generic,
        r#"{"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]}"#,
    );
    assert_eq!(p.calls.len(), 2);
    assert_eq!(
        (p.calls[0].arguments.as_str(), p.content),
        ("{\"x\": 1}", None)
    );
    let p = parse(ToolFormat::Generic, r#"{"response": "hello"}"#);
    assert_eq!((p.content.as_deref(), p.calls.len()), (Some("hello"), 0));
    let p = parse(ToolFormat::Generic, r#"{"tool_calls": [{"na"#);
    assert_eq!(p.content.as_deref(), Some(r#"{"tool_calls": [{"na"#));
    let p = parse(ToolFormat::Hermes, "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>");
    assert_eq!(
        p.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(p.content.as_deref(), Some("Let me check."));
    let p = parse(
        ToolFormat::Llama3,
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 2}}",
    );
    assert_eq!(
        (p.calls[0].name.as_str(), p.calls[0].arguments.as_str()),
        ("a", "{\"x\": 2}")
    );
    let p = parse(
        ToolFormat::Mistral,
        "[{\"name\": \"a\", \"arguments\": {}}]",
    );
    assert_eq!(p.calls.len(), 1);
    let p = parse(ToolFormat::Llama3, "The weather is fine.");
    assert_eq!(
        (p.content.as_deref(), p.calls.len()),
        (Some("The weather is fine."), 0)
    );
}
