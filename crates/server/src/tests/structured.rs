//! Structured outputs at the HTTP layer (over the fake, whose byte vocabulary compiles
//! grammars): every field that would change the answer is honoured or refused by name, a bad
//! grammar is a 400 naming `response_format`, and a good one reaches the engine compiled.

use crate::inference::body_rules::UNSUPPORTED;

use super::*;

fn chat(extra: Value) -> Value {
    let mut b = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}]});
    b.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    b
}

#[tokio::test]
async fn every_unsupported_field_is_a_400_naming_it() {
    let a = app(None).await;
    for (name, _) in UNSUPPORTED {
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let mut body = chat(json!({name.to_string(): {"x": 1}}));
            body["prompt"] = json!("hi");
            let (status, param, message) = a.error(path, body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{name} on {path}");
            assert_eq!(param.as_deref(), Some(*name), "{message}");
        }
    }
    for (field, value) in [
        ("modalities", json!(["text", "audio"])),
        ("best_of", json!(3)),
    ] {
        let (status, param, _) = a
            .error("/v1/chat/completions", chat(json!({field: value})))
            .await;
        assert_eq!(
            (status, param.as_deref()),
            (StatusCode::BAD_REQUEST, Some(field))
        );
    }
    // fields that do not change the answer are accepted
    let (status, _, _) = a
        .post(
            "/v1/chat/completions",
            chat(json!({"modalities": ["text"], "store": false, "service_tier": "auto", "best_of": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn bad_grammars_and_biases_are_400s_naming_the_field() {
    let a = app(None).await;
    let cases = [
        (
            json!({"response_format": {"type": "regex", "regex": "("}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 3}}}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "lark", "lark": "start: nothing_defined"}}),
            "response_format",
        ),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (json!({"logit_bias": {"999": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 101}}), "logit_bias"),
    ];
    for (extra, field) in cases {
        let (status, param, message) = a.error("/v1/chat/completions", chat(extra.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {message}");
        assert_eq!(param.as_deref(), Some(field), "{extra}: {message}");
    }
    // an unknown response_format type is refused, not ignored
    let (status, _, message) = a
        .error(
            "/v1/chat/completions",
            chat(json!({"response_format": {"type": "yaml"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.contains("yaml"), "{message}");
}

#[tokio::test]
async fn a_good_grammar_and_a_bias_reach_the_engine() {
    let a = app(None).await;
    let kinds = [
        (json!({"type": "json_object"}), Some("json_object")),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}),
            Some("json_schema"),
        ),
        (json!({"type": "regex", "regex": "[a-z]+"}), Some("regex")),
        (
            json!({"type": "lark", "lark": "start: \"yes\" | \"no\""}),
            Some("lark"),
        ),
        (json!({"type": "text"}), None),
    ];
    for (format, kind) in kinds {
        let body = chat(json!({"response_format": format, "logit_bias": {"104": -100}}));
        let (status, _, bytes) = a.post("/v1/chat/completions", body).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        let sub = a.ctl.submitted.lock().unwrap();
        let last = sub.last().unwrap();
        assert_eq!(last.constraint.as_ref().map(|c| c.kind()), kind);
        assert_eq!(last.params.logit_bias, vec![(104, -100.0)]);
    }
    // completions take response_format too
    let body = json!({"model": "fake", "prompt": "hi", "response_format": {"type": "json_object"}});
    let (status, _, _) = a.post("/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK);
    let sub = a.ctl.submitted.lock().unwrap();
    assert_eq!(
        sub.last().unwrap().constraint.as_ref().map(|c| c.kind()),
        Some("json_object")
    );
}
