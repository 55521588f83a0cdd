//! One request path: the same chat becomes the same prompt tokens through `serve` (over HTTP,
//! `return_token_ids`), `generate`, eval in process, eval against the server and eval answered
//! by an `abserve worker` from RabbitMQ — for the
//! default model and for a copy whose vocabulary asks for a BOS token (Llama 3, Mistral and
//! Gemma do; written by scripts/test-model-bos.py with the `gguf` package, never committed) —
//! and a prompt starts with exactly one BOS where the model wants one, none where it does not.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use support::{
    amqp_url, client, delete_queues, exclusive, jsonl, model, post_json, root, tmp, Guard, Server,
    MODEL_ID,
};

const SYSTEM: &str = "You answer in one word.";
const QUESTION: &str = "Which colour is the sky?";
/// The engine every path runs: the flags of `generate`, `worker` and eval in process (serve's
/// come from the test support's defaults).
const ENGINE: [&str; 6] = [
    "--memory-budget",
    "1GiB",
    "--context",
    "512",
    "--threads",
    "2",
];
/// SmolLM2's BOS (`<|im_start|>`, which its ChatML template also writes first).
const BOS: i64 = 1;

/// The default model with `tokenizer.ggml.add_bos_token = true`.
fn bos_model() -> PathBuf {
    let dir = root().join("models/test");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("SmolLM2-135M-Instruct.add-bos.gguf");
    if !out.exists() {
        let python = root().join(".venv/bin/python");
        let o = Command::new(&python)
            .arg(root().join("scripts/test-model-bos.py"))
            .arg(model())
            .arg(&out)
            .output()
            .unwrap_or_else(|e| panic!("{} (made by scripts/test.sh): {e}", python.display()));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    out
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not token ids: {v}"))
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect()
}

/// `generate --json` over one JSONL line: the prompt token ids it ran.
fn generate(model: &Path, line: Value) -> Vec<i64> {
    let dir = tmp("generate");
    let file = dir.join("prompts.jsonl");
    std::fs::write(&file, format!("{line}\n")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_abserve"))
        .args(["generate", "--model", &model.display().to_string()])
        .args(ENGINE)
        .args([
            "--max-tokens",
            "2",
            "--json",
            "--prompts",
            &file.display().to_string(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first: Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    ids(&first["prompt_token_ids"])
}

/// `abserve eval` of a two-variant experiment (both send SYSTEM + the row's input) on one row:
/// the prompt tokens of each variant's call.
fn eval(target: &[String]) -> Vec<u64> {
    let dir = tmp("eval");
    let config = dir.join("eval.toml");
    let variant = |id: &str| {
        format!("[[experiment.variants]]\nid = \"{id}\"\nsystem = \"{SYSTEM}\"\ntemplate = \"{{{{ input }}}}\"\ntemperature = 0.0\nmax_tokens = 2\n\n")
    };
    std::fs::write(
        &config,
        format!(
            "[[experiment]]\nname = \"one-path\"\n\n{}{}",
            variant("a"),
            variant("b")
        ),
    )
    .unwrap();
    let data = dir.join("rows.jsonl");
    std::fs::write(
        &data,
        format!("{}\n", json!({"id": "r1", "input": QUESTION})),
    )
    .unwrap();
    let out = dir.join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_abserve"))
        .arg("eval")
        .arg(&config)
        .args(["--dataset", &data.display().to_string()])
        .args(["--out", &out.display().to_string()])
        .args(target)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    jsonl(&out.join("results.jsonl"))
        .iter()
        .map(|v| {
            assert!(v["error"].is_null(), "{v}");
            v["prompt_tokens"].as_u64().unwrap()
        })
        .collect()
}

/// The eval answered by an `abserve worker` on `model` through a queue of this test's own.
async fn on_a_worker(model: &Path, name: &str) -> Vec<u64> {
    let queue = format!("abserve.test.one-path.{}.{name}", std::process::id());
    let worker = Command::new(env!("CARGO_BIN_EXE_abserve"))
        .args(["worker", "--amqp", &amqp_url(), "--queue", &queue])
        .args(["--model", &model.display().to_string()])
        .args(ENGINE)
        .spawn()
        .unwrap();
    let worker = Guard(worker);
    let counts = eval(&["--amqp".into(), amqp_url(), "--queue".into(), queue.clone()]);
    drop(worker);
    let conn = abserve_queue::lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .expect("RabbitMQ reachable (scripts/services.sh)");
    delete_queues(&conn.create_channel().await.unwrap(), &queue).await;
    counts
}

async fn same_tokens_on_every_path(model: PathBuf, wants_bos: bool) {
    let messages =
        json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]);
    let path = model.display().to_string();
    let turn = exclusive();
    let from_generate = generate(&model, json!({"messages": messages}));
    let text_generate = generate(&model, json!({"prompt": QUESTION}));
    let mut in_process = vec!["--model".to_string(), path.clone()];
    in_process.extend(ENGINE.map(String::from));
    let in_process = eval(&in_process);
    let on_worker = on_a_worker(&model, if wants_bos { "bos" } else { "plain" }).await;
    drop(turn);
    let s = Server::start(&["--model", &path]);
    let c = client();
    let (status, chat) = post_json(
        &c,
        &s.url("/v1/chat/completions"),
        json!({"model": MODEL_ID, "messages": messages, "max_tokens": 2, "temperature": 0, "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, 200, "{chat}");
    let from_serve = ids(&chat["choices"][0]["prompt_token_ids"]);
    assert_eq!(chat["usage"]["prompt_tokens"], from_serve.len());
    let (status, text) = post_json(
        &c,
        &s.url("/v1/completions"),
        json!({"model": MODEL_ID, "prompt": QUESTION, "max_tokens": 2, "return_token_ids": true}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let text_serve = ids(&text["choices"][0]["prompt_token_ids"]);
    let over_http = eval(&["--url".into(), s.url("")]);

    assert_eq!(
        from_generate, from_serve,
        "generate and serve prepare the chat differently"
    );
    let n = from_serve.len() as u64;
    assert_eq!(
        in_process,
        [n, n],
        "eval in process counts other prompt tokens than serve"
    );
    assert_eq!(
        over_http,
        [n, n],
        "eval --url counts other prompt tokens than serve"
    );
    assert_eq!(
        on_worker,
        [n, n],
        "the worker counts other prompt tokens than serve"
    );
    assert_eq!(
        text_generate, text_serve,
        "a text prompt differs between generate and serve"
    );
    // the chat template's first token is SmolLM2's BOS in both models; never twice
    assert_eq!(from_serve[0], BOS);
    assert_ne!(from_serve[1], BOS, "BOS twice: {from_serve:?}");
    // a text prompt: one BOS exactly where the vocabulary asks for it
    let bos_count = text_serve.iter().take_while(|&&t| t == BOS).count();
    assert_eq!(bos_count, usize::from(wants_bos), "{text_serve:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_default_model_gets_the_same_prompt_tokens_on_every_path() {
    same_tokens_on_every_path(model(), false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_wants_bos_gets_it_once_and_the_same_tokens_on_every_path() {
    same_tokens_on_every_path(bos_model(), true).await;
}
