//! The OpenAI-compatible API of a real `abserve serve` on the default model, through reqwest.

mod support;

use serde_json::{json, Value};
use support::{client, metric, post_json, sse, status, Server, MODEL_ID};

#[tokio::test(flavor = "multi_thread")]
async fn chat_completions_models_streaming_seed_stop_and_n() {
    let s = Server::start(&[]);
    let c = client();
    let models: Value = c
        .get(s.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL_ID);

    let (st, v) = post_json(&c,
        &s.url("/v1/chat/completions"),
        json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 16, "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(
        !v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty(),
        "{v}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );

    // the same seed gives the same text twice
    let seeded = json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 24, "temperature": 1.0, "seed": 42});
    let a = post_json(&c, &s.url("/v1/chat/completions"), seeded.clone())
        .await
        .1;
    let b = post_json(&c, &s.url("/v1/chat/completions"), seeded)
        .await
        .1;
    assert_eq!(
        a["choices"][0]["message"]["content"],
        b["choices"][0]["message"]["content"]
    );

    // stop string: the text ends before it
    let (_, v) = post_json(&c,
        &s.url("/v1/completions"),
        json!({"model": MODEL_ID, "prompt": "The capital of France is", "max_tokens": 30, "temperature": 0, "stop": ["."]}),
    )
    .await;
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["text"], " Paris");

    // n = 3 choices, indexed
    let (_, v) = post_json(&c,
        &s.url("/v1/chat/completions"),
        json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": 3}),
    )
    .await;
    let idx: Vec<u64> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, vec![0, 1, 2]);

    // streaming with usage, shaped as OpenAI sends it
    let r = c
        .post(s.url("/v1/chat/completions"))
        .json(&json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12,
                      "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let data = sse(r).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    let finish: Vec<&Value> = chunks
        .iter()
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finish.len(), 1);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    let (_, whole) = post_json(&c,
        &s.url("/v1/chat/completions"),
        json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12, "temperature": 0}),
    )
    .await;
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // logprobs
    let (_, v) = post_json(&c,
        &s.url("/v1/chat/completions"),
        json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": true, "top_logprobs": 2}),
    )
    .await;
    let lp = &v["choices"][0]["logprobs"]["content"];
    assert_eq!(lp.as_array().unwrap().len(), 3);
    assert_eq!(lp[0]["top_logprobs"].as_array().unwrap().len(), 2);

    // metrics count what happened
    let m = s.metrics().await;
    assert!(
        metric(
            &m,
            "abserve_requests_total{endpoint=\"chat_completions\",status=\"200\"}"
        )
        .unwrap()
            >= 6.0
    );
    assert!(metric(&m, "process_resident_memory_bytes").unwrap() > 0.0);
    assert!(metric(&m, "abserve_generated_tokens_total").unwrap() > 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn api_key_is_required_on_v1_only() {
    let s = Server::start(&["--api-key", "sekret"]);
    let c = client();
    let body = json!({"model": MODEL_ID, "prompt": "Hi", "max_tokens": 2});
    let r = c
        .post(s.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let r = c
        .post(s.url("/v1/completions"))
        .bearer_auth("wrong!")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = c
        .post(s.url("/v1/completions"))
        .bearer_auth("sekret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(status(c.get(s.url("/health"))).await, 200);
    assert_eq!(status(c.get(s.url("/ready"))).await, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn ready_runs_a_probe_and_reports_the_plan() {
    let s = Server::start(&[]);
    let c = client();
    let r = c.get(s.url("/ready")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "ready");
    assert!(v["probe_latency_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(v["plan"]["kv_cells"], 4096);
    let m = s.metrics().await;
    // the probe went through the engine: one generated token at least
    assert!(metric(&m, "abserve_generated_tokens_total").unwrap() >= 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_pass_promtool() {
    let s = Server::start(&[]);
    let c = client();
    post_json(
        &c,
        &s.url("/v1/completions"),
        json!({"model": MODEL_ID, "prompt": "Hi", "max_tokens": 3}),
    )
    .await;
    let text = s.metrics().await;
    for name in [
        "abserve_memory_budget_bytes",
        "abserve_memory_planned_bytes{component=\"weights\"}",
        "abserve_memory_planned_bytes{component=\"kv\"}",
        "abserve_memory_planned_bytes{component=\"compute\"}",
        "abserve_kv_cells_total",
        "abserve_kv_cells_used",
        "abserve_requests_running",
        "abserve_requests_waiting",
        "abserve_preemptions_total",
        "abserve_cancellations_total",
        "abserve_prompt_tokens_total",
        "abserve_generated_tokens_total",
        "abserve_rejections_total{reason=\"queue_full\"}",
        "abserve_time_to_first_token_seconds_count",
        "abserve_request_duration_seconds_count",
        "abserve_time_per_output_token_seconds_count",
        "abserve_engine_step_seconds_count",
        "process_resident_memory_bytes",
    ] {
        assert!(metric(&text, name).is_some(), "missing {name}");
    }
    support::promtool_check(&text);
}

/// `n` and multi-prompt completions are admitted as one group: with 8 slots and no queue, 16
/// sequences can never be held at once (a 400 naming the slots and the queue, as a too-wide
/// fan-out gets); with 16 slots all 16 run and answer.
#[tokio::test(flavor = "multi_thread")]
async fn n_and_many_prompts_are_admitted_whole_or_refused_with_the_reason() {
    let c = client();
    let chat = json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n": 16});
    let prompts: Vec<String> = (0..16).map(|i| format!("Count to {i}:")).collect();
    let text = json!({"model": MODEL_ID, "prompt": prompts, "max_tokens": 2});
    {
        let s = Server::start(&["--max-sequences", "8", "--max-queue", "0"]);
        let before = metric(&s.metrics().await, "abserve_prompt_tokens_total");
        for (path, body, param) in [
            ("/v1/chat/completions", &chat, "n"),
            ("/v1/completions", &text, "prompt"),
        ] {
            let (status, v) = post_json(&c, &s.url(path), body.clone()).await;
            assert_eq!(status, 400, "{path}: {v}");
            assert_eq!(v["error"]["param"], param, "{v}");
            let m = v["error"]["message"].as_str().unwrap();
            assert!(m.contains("8 sequence slots + 0 queued"), "{m}");
        }
        let after = metric(&s.metrics().await, "abserve_prompt_tokens_total");
        assert_eq!(
            after, before,
            "no sequence of a refused group reached the engine"
        );
    }
    // 16 slots of 256 tokens in the tests' 4096 KV cells
    let s = Server::start(&[
        "--max-sequences",
        "16",
        "--max-queue",
        "0",
        "--context",
        "256",
    ]);
    for (path, body) in [("/v1/chat/completions", &chat), ("/v1/completions", &text)] {
        let (status, v) = post_json(&c, &s.url(path), body.clone()).await;
        assert_eq!(status, 200, "{path}: {v}");
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 16, "{v}");
        assert!(choices.iter().all(|x| x["finish_reason"].is_string()));
    }
}
