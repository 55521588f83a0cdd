//! Greedy output, batch 1, equals llama.cpp's own server loop token for token, with flash
//! attention off and on (fixture recorded by scripts/record_reference.py with the prebuilt
//! xllamacpp package). With flash attention on this holds because llama.cpp is built without
//! floating-point contraction, as the prebuilt package's compiler leaves it
//! (scripts/llama-cpp-no-common.cmake).

mod common;

use abserve_engine::prepare::Tokenizer;
use abserve_engine::ChatMessage;
use abserve_engine::Engine;
use serde_json::Value;

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/reference_greedy.json")).unwrap()
}

#[test]
fn greedy_matches_llama_cpp_reference() {
    let fx = fixture();
    let max_tokens = fx["max_tokens"].as_u64().unwrap() as u32;
    let runs = fx["runs"].as_array().unwrap();
    assert_eq!(
        runs.len(),
        2,
        "one run with flash attention off, one with it on"
    );
    for run in runs {
        let mut cfg = common::config();
        cfg.flash_attention = run["flash_attention"].as_bool().unwrap();
        // Each prompt alone in an empty cache, as in the reference run (cache_prompt off there).
        cfg.prefix_sharing = false;
        let engine = Engine::start(cfg).unwrap();
        check_run(&engine, run, max_tokens);
    }
}

/// Every prompt of one recorded run, one at a time (batch 1), against its recorded tokens.
fn check_run(engine: &Engine, run: &Value, max_tokens: u32) {
    let flash = &run["flash_attention"];
    let mut cases = Vec::new();
    for c in run["completions"].as_array().unwrap() {
        cases.push((engine.prompt_tokens(c["prompt"].as_str().unwrap()), c));
    }
    for c in run["chats"].as_array().unwrap() {
        let msgs: Vec<ChatMessage> = serde_json::from_value(c["messages"].clone()).unwrap();
        let text = engine.render_chat(&msgs, &[]).unwrap();
        cases.push((engine.prompt_tokens(&text), c));
    }
    assert!(cases.len() >= 5);
    for (prompt, c) in cases {
        let out = common::collect(common::greedy(engine, &prompt, max_tokens)).unwrap();
        let want: Vec<i32> = c["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap() as i32)
            .collect();
        assert_eq!(
            prompt.len() as u64,
            c["prompt_tokens"].as_u64().unwrap(),
            "prompt token count for {c}"
        );
        let got = &out.tokens[..want.len().min(out.tokens.len())];
        assert_eq!(
            got,
            &want[..got.len()],
            "tokens differ (flash attention {flash}) for {c}"
        );
        // the reference stops at an end-of-generation token without listing it
        assert!(
            out.tokens.len() == want.len() || out.tokens.len() == want.len() + 1,
            "length differs (flash attention {flash}) for {c}"
        );
        assert_eq!(out.text, c["text"].as_str().unwrap());
    }
}
