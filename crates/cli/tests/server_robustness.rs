//! The server never falls over: malformed input gets the documented 4xx, overload gets 429 with
//! Retry-After (never a 5xx or a hang), disconnects free KV cells, SIGTERM drains streams.

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use support::{client, metric, status, Server, MODEL_ID};

enum Body {
    Json(Value),
    Raw(Vec<u8>),
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_the_documented_4xx_and_the_server_keeps_serving() {
    let s = Server::start(&["--body-limit", "65536", "--api-key", "k"]);
    let c = client();
    let chat = "/v1/chat/completions";
    let comp = "/v1/completions";
    let m = |content: &str| json!([{"role": "user", "content": content}]);
    let long = "word ".repeat(700);
    let cases: Vec<(&str, &str, Body, u16)> = vec![
        ("bad json", chat, Body::Raw(b"{\"model\": ".to_vec()), 400),
        ("not an object", chat, Body::Raw(b"[1,2,3]".to_vec()), 400),
        ("empty body", chat, Body::Raw(vec![]), 400),
        ("non-utf8 bytes", chat, Body::Raw(vec![0xff, 0xfe, 0x7b, 0x22]), 400),
        ("missing messages", chat, Body::Json(json!({"model": MODEL_ID})), 400),
        ("messages not a list", chat, Body::Json(json!({"model": MODEL_ID, "messages": "hi"})), 400),
        ("empty messages", chat, Body::Json(json!({"model": MODEL_ID, "messages": []})), 400),
        ("unknown role", chat, Body::Json(json!({"model": MODEL_ID, "messages": [{"role": "wizard", "content": "x"}]})), 400),
        ("role not a string", chat, Body::Json(json!({"model": MODEL_ID, "messages": [{"role": 5, "content": "x"}]})), 400),
        ("content wrong type", chat, Body::Json(json!({"model": MODEL_ID, "messages": [{"role": "user", "content": 12}]})), 400),
        ("image part", chat, Body::Json(json!({"model": MODEL_ID, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})), 400),
        ("missing model", chat, Body::Json(json!({"messages": m("x")})), 400),
        ("unknown model", chat, Body::Json(json!({"model": "gpt-9", "messages": m("x")})), 404),
        ("model wrong type", chat, Body::Json(json!({"model": 7, "messages": m("x")})), 400),
        ("negative max_tokens", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "max_tokens": -5})), 400),
        ("zero max_tokens", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "max_tokens": 0})), 400),
        ("huge max_tokens", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "max_tokens": 1_000_000})), 400),
        ("max_tokens string", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "max_tokens": "ten"})), 400),
        ("max_completion_tokens negative", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "max_completion_tokens": -1})), 400),
        ("temperature too high", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "temperature": 7})), 400),
        ("temperature negative", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "temperature": -1})), 400),
        ("top_p zero", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "top_p": 0})), 400),
        ("top_p above one", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "top_p": 1.5})), 400),
        ("n zero", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "n": 0})), 400),
        ("n too large", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "n": 1000})), 400),
        ("presence penalty", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "presence_penalty": 3})), 400),
        ("frequency penalty", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "frequency_penalty": -3})), 400),
        ("five stops", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "stop": ["a", "b", "c", "d", "e"]})), 400),
        ("empty stop", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "stop": [""]})), 400),
        ("stop wrong type", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "stop": 3})), 400),
        ("top_logprobs too many", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "logprobs": true, "top_logprobs": 50})), 400),
        ("top_logprobs without logprobs", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "top_logprobs": 2})), 400),
        ("stream wrong type", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "stream": "yes"})), 400),
        ("seed wrong type", chat, Body::Json(json!({"model": MODEL_ID, "messages": m("x"), "seed": "abc"})), 400),
        ("prompt longer than context", chat, Body::Json(json!({"model": MODEL_ID, "messages": m(&long)})), 400),
        ("completion without prompt", comp, Body::Json(json!({"model": MODEL_ID})), 400),
        ("completion empty prompt list", comp, Body::Json(json!({"model": MODEL_ID, "prompt": []})), 400),
        ("completion token out of vocab", comp, Body::Json(json!({"model": MODEL_ID, "prompt": [1, 2, 99999999]})), 400),
        ("completion logprobs too many", comp, Body::Json(json!({"model": MODEL_ID, "prompt": "x", "logprobs": 9})), 400),
        ("completion echo (not supported)", comp, Body::Json(json!({"model": MODEL_ID, "prompt": "x", "echo": true})), 400),
        ("completion empty prompt", comp, Body::Json(json!({"model": MODEL_ID, "prompt": ""})), 400),
        ("oversized body", chat, Body::Raw(format!("{{\"model\":\"{MODEL_ID}\",\"messages\":[{{\"role\":\"user\",\"content\":\"{}\"}}]}}", "a".repeat(100_000)).into_bytes()), 413),
    ];
    assert!(cases.len() >= 30);
    for (name, path, body, want) in cases {
        let req = c.post(s.url(path)).bearer_auth("k");
        let req = match body {
            Body::Json(v) => req.json(&v),
            Body::Raw(b) => req.header("content-type", "application/json").body(b),
        };
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, want, "{name}: got {status} {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{name}: OpenAI error shape: {v}"
        );
        assert!(v["error"]["type"].is_string(), "{name}: {v}");
    }
    // missing and wrong auth
    let r = c
        .post(s.url(chat))
        .json(&json!({"model": MODEL_ID, "messages": m("x")}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // wrong method and unknown path
    assert_eq!(status(c.get(s.url(chat)).bearer_auth("k")).await, 405);
    assert_eq!(status(c.get(s.url("/v2/nothing"))).await, 404);
    // the too-long prompt's message names the numbers
    let r = c
        .post(s.url(chat))
        .bearer_auth("k")
        .json(&json!({"model": MODEL_ID, "messages": m("hello"), "max_tokens": 600}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("512"),
        "{v}"
    );
    // still serving
    let r = c
        .post(s.url(chat))
        .bearer_auth("k")
        .json(&json!({"model": MODEL_ID, "messages": m("Hi"), "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = s.metrics().await;
    assert_eq!(
        metric(
            &text,
            "abserve_requests_total{endpoint=\"chat_completions\",status=\"500\"}"
        ),
        None
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn burst_of_50_gets_only_200_and_429_and_memory_returns_to_idle() {
    let s = Server::start(&[
        "--max-queue",
        "2",
        "--max-sequences",
        "4",
        "--queue-timeout",
        "60",
    ]);
    let c = client();
    // one request first, so that the compute buffers are touched before "idle" is measured
    let warm = c
        .post(s.url("/v1/completions"))
        .json(&json!({"model": MODEL_ID, "prompt": "Hi", "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(warm.status(), 200);
    // the answer can reach the client a step before the engine frees its cells: wait for idle
    let deadline = Instant::now() + Duration::from_secs(10);
    let idle = loop {
        let m = s.metrics().await;
        if metric(&m, "abserve_requests_running") == Some(0.0)
            && metric(&m, "abserve_kv_cells_used") == Some(0.0)
        {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "the warm-up request did not leave the engine idle"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let idle_kv = metric(&idle, "abserve_kv_cells_used").unwrap();
    let idle_rss = metric(&idle, "process_resident_memory_bytes").unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let c = c.clone();
            let url = s.url("/v1/completions");
            tokio::spawn(async move {
                let r = c
                    .post(url)
                    .json(&json!({"model": MODEL_ID, "prompt": format!("Story {i}:"), "max_tokens": 24, "ignore_eos": true}))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
                let v: Value = r.json().await.unwrap();
                (status, retry, v)
            })
        })
        .collect();
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        let (status, retry, v) = t.await.unwrap();
        match status {
            200 => {
                ok += 1;
                assert_eq!(v["usage"]["completion_tokens"], 24);
            }
            429 => {
                limited += 1;
                assert!(retry.is_some_and(|r| r >= 1), "429 without Retry-After");
                assert_eq!(v["error"]["code"], "rate_limit_exceeded");
            }
            other => panic!("status {other}: {v}"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(110), "no hang");
    assert!(ok >= 4 && limited >= 1, "ok {ok}, 429 {limited}");
    // back to idle
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = s.metrics().await;
        let kv = metric(&m, "abserve_kv_cells_used").unwrap();
        let running = metric(&m, "abserve_requests_running").unwrap();
        if kv == idle_kv && running == 0.0 {
            assert!(
                metric(&m, "abserve_rejections_total{reason=\"queue_full\"}").unwrap()
                    >= limited as f64
            );
            let rss = metric(&m, "process_resident_memory_bytes").unwrap();
            assert!(
                rss <= idle_rss * 1.10,
                "RSS {rss} did not return near idle {idle_rss}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "KV {kv} / running {running} did not return to idle"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_ten_streams_frees_their_cells() {
    // 16 slots × 512 cells: all ten streams run at once
    let s = Server::start(&["--kv-cells", "8192"]);
    let c = client();
    let mut streams = vec![];
    for i in 0..10 {
        let r = c
            .post(s.url("/v1/chat/completions"))
            .json(&json!({"model": MODEL_ID, "messages": [{"role": "user", "content": format!("Write a long essay number {i}.")}],
                          "max_tokens": 400, "ignore_eos": true, "stream": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        streams.push(r.bytes_stream());
    }
    // every stream is producing
    for st in streams.iter_mut() {
        for _ in 0..3 {
            st.next().await.unwrap().unwrap();
        }
    }
    let busy = s.metrics().await;
    assert!(metric(&busy, "abserve_kv_cells_used").unwrap() > 100.0);
    drop(streams);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = s.metrics().await;
        if metric(&m, "abserve_kv_cells_used").unwrap() == 0.0 {
            assert!(metric(&m, "abserve_cancellations_total").unwrap() >= 10.0);
            assert_eq!(metric(&m, "abserve_requests_running").unwrap(), 0.0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cells not freed after the clients left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_eight_streams_lets_them_finish_and_exits_zero() {
    let mut s = Server::start(&[]);
    let c = client();
    let mut tasks = vec![];
    for i in 0..8 {
        let r = c
            .post(s.url("/v1/completions"))
            .json(&json!({"model": MODEL_ID, "prompt": format!("Chapter {i}:"), "max_tokens": 64, "ignore_eos": true, "stream": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        tasks.push(tokio::spawn(async move {
            let mut st = r.bytes_stream();
            let mut all = String::new();
            while let Some(ch) = st.next().await {
                all.push_str(&String::from_utf8_lossy(&ch.unwrap()));
            }
            all
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let url = s.url("/ready");
    let new_req = s.url("/v1/completions");
    let exit = tokio::task::spawn_blocking(move || s.terminate());
    // while draining: not ready, and new work is refused with 503
    tokio::time::sleep(Duration::from_millis(100)).await;
    if let Ok(r) = c.get(&url).send().await {
        assert_eq!(r.status(), 503);
    }
    if let Ok(r) = c
        .post(&new_req)
        .json(&json!({"model": MODEL_ID, "prompt": "x", "max_tokens": 2}))
        .send()
        .await
    {
        assert_eq!(r.status(), 503);
    }
    for t in tasks {
        let body = t.await.unwrap();
        assert!(body.contains("data: [DONE]"), "stream cut short: {body}");
        assert!(body.contains("\"finish_reason\":\"length\""));
    }
    assert_eq!(exit.await.unwrap(), Some(0));
}

#[tokio::test(flavor = "multi_thread")]
async fn queue_timeout_answers_429() {
    let s = Server::start(&["--max-sequences", "1", "--queue-timeout", "0.5"]);
    let c = client();
    let long = {
        let c = c.clone();
        let url = s.url("/v1/completions");
        tokio::spawn(async move {
            c.post(url)
                .json(&json!({"model": MODEL_ID, "prompt": "Long:", "max_tokens": 300, "ignore_eos": true}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = c
        .post(s.url("/v1/completions"))
        .json(&json!({"model": MODEL_ID, "prompt": "Short:", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(long.await.unwrap(), 200);
    let m = s.metrics().await;
    assert!(metric(&m, "abserve_rejections_total{reason=\"queue_timeout\"}").unwrap() >= 1.0);
}
