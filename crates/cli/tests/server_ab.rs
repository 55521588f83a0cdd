//! The A/B layer through a real `abserve serve`: assignment and exposures, A/A and a known
//! effect, fair fan-out, durability across kill -9, the KV quota, and bad definitions.

mod support;

use std::time::Duration;

use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use serde_json::{json, Value};
use support::{client, kill9, metric, status, Server};

fn two_identical(name: &str) -> Value {
    json!({
        "name": name,
        "variants": [
            {"id": "a", "weight": 0.5, "system": "Answer in one word.", "temperature": 0.0, "max_tokens": 1},
            {"id": "b", "weight": 0.5, "system": "Answer in one word.", "temperature": 0.0, "max_tokens": 1}
        ]
    })
}

async fn create(c: &reqwest::Client, s: &Server, def: &Value) -> (u16, Value) {
    let r = c
        .post(s.url("/v1/experiments"))
        .json(def)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn aa_test_shows_nothing_and_a_known_effect_is_detected() {
    let s = Server::start(&[]);
    let c = client();
    for name in ["aa", "effect"] {
        assert_eq!(create(&c, &s, &two_identical(name)).await.0, 201);
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let noise = Normal::new(10.0, 2.0).unwrap();
    for name in ["aa", "effect"] {
        let mut events = vec![];
        // 200 units, 20 requests in flight at a time (as a harness would send them)
        for block in 0..10 {
            let reqs = (0..20).map(|j| {
                let unit = format!("user-{}", block * 20 + j);
                let c = c.clone();
                let url = s.url("/v1/chat/completions");
                async move {
                    let r = c
                        .post(url)
                        .json(&json!({"model": format!("experiment:{name}"), "user": unit, "messages": [{"role": "user", "content": "Capital of France?"}]}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 200);
                    let variant = r.headers()["x-abserve-variant"].to_str().unwrap().to_string();
                    assert_eq!(r.headers()["x-abserve-experiment"], name);
                    let body: Value = r.json().await.unwrap();
                    assert_eq!(body["abserve"]["variant"], variant.as_str());
                    assert_eq!(body["usage"]["completion_tokens"], 1);
                    (unit, variant)
                }
            });
            for (unit, variant) in futures::future::join_all(reqs).await {
                let shift = if name == "effect" && variant == "b" {
                    1.5
                } else {
                    0.0
                };
                events.push(json!({"unit": unit, "metric": "satisfaction", "value": noise.sample(&mut rng) + shift}));
            }
        }
        for (k, chunk) in events.chunks(50).enumerate() {
            let r = c
                .post(s.url(&format!("/v1/experiments/{name}/events")))
                .json(&json!({"events": chunk, "batch_id": format!("{name}-{k}")}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    }
    let results = |name: &'static str| {
        let c = c.clone();
        let url = s.url(&format!("/v1/experiments/{name}/results"));
        async move {
            c.get(url)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let aa = results("aa").await;
    assert_eq!(aa["srm"]["mismatch"], false, "{aa}");
    let units: u64 = aa["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["units"].as_u64().unwrap())
        .sum();
    assert_eq!(units, 200);
    let p = aa["variants"][1]["metrics"]["satisfaction"]["vs_control"]["p_value"]
        .as_f64()
        .unwrap();
    assert!(p > 0.05, "A/A shows a difference: p = {p}");
    // automatic per-exposure metrics are there too
    assert!(
        aa["variants"][0]["metrics"]["latency_ms"]["summary"]["n"]
            .as_u64()
            .unwrap()
            > 0
    );
    let eff = results("effect").await;
    let cmp = &eff["variants"][1]["metrics"]["satisfaction"]["vs_control"];
    assert!(
        cmp["p_value"].as_f64().unwrap() < 0.05,
        "effect not detected: {cmp}"
    );
    assert!(cmp["diff"].as_f64().unwrap() > 0.5);
    // the CLI reads the same results from the store
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_abserve"))
        .args([
            "experiments",
            "results",
            "effect",
            "--json",
            "--data-dir",
            &s.data_dir,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sat = |v: &Value| v["variants"][1]["metrics"]["satisfaction"].clone();
    for k in ["vs_control", "sequential", "bayesian", "adjusted"] {
        assert!(sat(&eff)[k].is_object(), "results carry {k}: {}", sat(&eff));
        assert_eq!(
            sat(&cli)[k],
            sat(&eff)[k],
            "the CLI and the API give the same {k}"
        );
    }
    // a 1.5 effect (sd 2) on 100 units per arm: the always-valid sequence is wider than the
    // fixed-horizon interval, and the Bayesian read-out is sure of the direction
    let seq = &sat(&eff)["sequential"];
    assert!(
        seq["ci_high"].as_f64().unwrap() - seq["ci_low"].as_f64().unwrap()
            > cmp["ci_high"].as_f64().unwrap() - cmp["ci_low"].as_f64().unwrap()
    );
    assert!(
        sat(&eff)["bayesian"]["chance_to_beat_control"]
            .as_f64()
            .unwrap()
            > 0.95
    );
    let table = std::process::Command::new(env!("CARGO_BIN_EXE_abserve"))
        .args([
            "experiments",
            "results",
            "effect",
            "--data-dir",
            &s.data_dir,
        ])
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&table.stdout);
    for want in [
        "satisfaction",
        "fixed horizon",
        "sequential",
        "always-valid p",
        "P(beat control)",
        "Holm p",
    ] {
        assert!(t.contains(want), "the table shows {want}: {t}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fanout_of_two_identical_variants_is_fair() {
    let s = Server::start(&[]);
    let c = client();
    assert_eq!(create(&c, &s, &two_identical("fair")).await.0, 201);
    let mut a_first = 0;
    let (mut lat_a, mut lat_b) = (0.0, 0.0);
    let rounds = 200;
    for i in 0..rounds {
        let r = c
            .post(s.url("/v1/experiments/fair/fanout"))
            .json(&json!({"input": format!("Question {i}: what is two plus two?")}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        let res = v["results"].as_array().unwrap();
        assert_eq!(res.len(), 2);
        assert_eq!(
            res[0]["output"], res[1]["output"],
            "identical greedy variants give the same text"
        );
        if res[0]["admission_rank"] == 0 {
            a_first += 1;
        }
        lat_a += res[0]["latency_ms"].as_f64().unwrap();
        lat_b += res[1]["latency_ms"].as_f64().unwrap();
    }
    let share = a_first as f64 / rounds as f64;
    let ratio = lat_a / lat_b;
    eprintln!("variant a admitted first in {share:.2} of {rounds} fan-outs; mean latency ratio a/b = {ratio:.3}");
    assert!((0.4..=0.6).contains(&share), "a first {share}");
    assert!((0.8..=1.25).contains(&ratio), "latency ratio {ratio}");
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_events_survive_kill_9_and_are_not_counted_twice() {
    let dir = std::env::temp_dir().join(format!("abserve-durable-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.display().to_string();
    let mut s = Server::start(&["--data-dir", &d]);
    let c = client();
    assert_eq!(create(&c, &s, &two_identical("durable")).await.0, 201);
    let mut batches = vec![];
    for b in 0..20 {
        let events: Vec<Value> = (0..50)
            .map(|i| json!({"unit": format!("u{}", b * 50 + i), "metric": "m", "value": i as f64}))
            .collect();
        let body = json!({"events": events, "batch_id": format!("batch-{b}")});
        let r = c
            .post(s.url("/v1/experiments/durable/events"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        batches.push(body);
    }
    kill9(&mut s);
    let s = Server::start(&["--data-dir", &d]);
    // a retried batch is not stored again
    let r: Value = c
        .post(s.url("/v1/experiments/durable/events"))
        .json(&batches[7])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["duplicate_batch"], true);
    let store = abserve_ab::Store::open(&dir).await.unwrap();
    assert_eq!(store.count_events("durable").await.unwrap(), 1000);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_experiment_capped_at_a_quarter_of_kv_holds_at_most_a_quarter() {
    let s = Server::start(&["--kv-cells", "1024", "--max-queue", "200"]);
    let c = client();
    let mut capped = two_identical("capped");
    capped["max_kv_share"] = json!(0.25);
    capped["variants"][0]["max_tokens"] = json!(60);
    capped["variants"][1]["max_tokens"] = json!(60);
    assert_eq!(create(&c, &s, &capped).await.0, 201);
    assert_eq!(create(&c, &s, &two_identical("other")).await.0, 201);
    let flood: Vec<_> = (0..12)
        .map(|i| {
            let c = c.clone();
            let url = s.url("/v1/completions");
            tokio::spawn(async move {
                c.post(url)
                    .json(&json!({"model": "experiment:capped", "user": format!("f{i}"), "prompt": format!("Write a long story number {i}:"), "ignore_eos": true}))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // the other experiment keeps completing during the flood
    for i in 0..5 {
        let r = c
            .post(s.url("/v1/chat/completions"))
            .json(&json!({"model": "experiment:other", "user": format!("o{i}"), "messages": [{"role": "user", "content": "Hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let mut max_seen = 0.0f64;
    for t in flood {
        assert_eq!(t.await.unwrap(), 200);
        let m = s.metrics().await;
        max_seen = max_seen.max(
            metric(
                &m,
                "abserve_experiment_kv_cells_used{experiment=\"capped\"}",
            )
            .unwrap_or(0.0),
        );
    }
    let m = s.metrics().await;
    let peak = metric(
        &m,
        "abserve_experiment_kv_cells_peak{experiment=\"capped\"}",
    )
    .unwrap();
    eprintln!("capped experiment: peak {peak} of 1024 KV cells (sampled max {max_seen})");
    assert!(peak > 0.0 && peak <= 256.0, "peak {peak} over 25% of 1024");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_definitions_and_unknown_experiments_are_4xx() {
    let s = Server::start(&[]);
    let c = client();
    let mut dup = two_identical("dup");
    dup["variants"][1]["id"] = json!("a");
    let (st, v) = create(&c, &s, &dup).await;
    assert_eq!(st, 400);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("duplicate variant id"));
    let mut neg = two_identical("neg");
    neg["variants"][0]["weight"] = json!(-1);
    assert_eq!(create(&c, &s, &neg).await.0, 400);
    let mut tmpl = two_identical("tmpl");
    tmpl["variants"][0]["template"] = json!("{{ input ");
    let (st, v) = create(&c, &s, &tmpl).await;
    assert_eq!(st, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("template"));
    let one = json!({"name": "one", "variants": [{"id": "a"}]});
    assert_eq!(create(&c, &s, &one).await.0, 400);
    assert_eq!(create(&c, &s, &two_identical("ok")).await.0, 201);
    assert_eq!(create(&c, &s, &two_identical("ok")).await.0, 409);
    let r = c
        .post(s.url("/v1/chat/completions"))
        .json(&json!({"model": "experiment:nope", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        status(c.get(s.url("/v1/experiments/nope/results"))).await,
        404
    );
    assert_eq!(
        status(
            c.post(s.url("/v1/experiments/nope/events"))
                .json(&json!({"unit": "u", "metric": "m", "value": 1}))
        )
        .await,
        404
    );
    // forced variant for QA
    let r = c
        .post(s.url("/v1/chat/completions"))
        .header("x-abserve-variant", "b")
        .json(&json!({"model": "experiment:ok", "user": "qa", "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-abserve-variant"], "b");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["abserve"]["forced"], true);
    let res: Value = c
        .get(s.url("/v1/experiments/ok/results"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        res["variants"][1]["units"], 0,
        "forced exposures are excluded from stats"
    );
    // still serving
    assert_eq!(status(c.get(s.url("/health"))).await, 200);
    assert_eq!(status(c.delete(s.url("/v1/experiments/ok"))).await, 200);
    assert_eq!(status(c.get(s.url("/v1/experiments/ok"))).await, 404);
}
