//! Eval runs started over sampled conversations (issue 45), over the fake: the filter's samples
//! replayed over every variant in process, judged by a model of the registry in both orders,
//! the summary and HTML report kept with the run; bad requests refused before anything runs.

use axum::http::header;

use super::*;

const SAMPLED: &str = r#"
[[experiment]]
name = "greet"
[experiment.samples]
rate = 1.0
[[experiment.variants]]
id = "a"
system = "Be brief."
max_tokens = 4
[[experiment.variants]]
id = "b"
max_tokens = 4
"#;

impl App {
    async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        let (s, _, bytes) = self.call("GET", path, None, &[]).await;
        (s, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
}

async fn finished(a: &App, id: i64) -> Value {
    for _ in 0..600 {
        let (s, run) = a
            .get_json(&format!("/v1/experiments/greet/evals/{id}"))
            .await;
        assert_eq!(s, StatusCode::OK, "{run}");
        if run["status"] != "running" {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("eval run {id} still running after 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eval_run_replays_the_filtered_samples_over_every_variant_and_keeps_its_report() {
    let a = app(Some(SAMPLED)).await;
    for i in 0..6 {
        let body = json!({"model": "experiment:greet", "user": format!("u{i}"),
                          "messages": [{"role": "user", "content": format!("question number {i}")}]});
        let (s, _, _) = a.post("/v1/chat/completions", body).await;
        assert_eq!(s, StatusCode::OK);
    }
    let store = a.state.experiments.ab.as_ref().unwrap().store().clone();
    for _ in 0..500 {
        let n = store
            .samples("greet", &Default::default())
            .await
            .unwrap()
            .len();
        if n == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let path = "/v1/experiments/greet/evals";
    for (body, param) in [
        (json!({"judge": "nope"}), "judge"),
        (json!({"filter": {"limit": 501}}), "filter.limit"),
        (json!({"filter": {"before": 3}}), "filter.before"),
        (json!({"filter": {"q": "no such words"}}), "filter"),
        (json!({"filter": {"colour": "red"}}), "filter"),
    ] {
        let (s, p, text) = a.error(path, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {text}");
        assert_eq!(p.as_deref(), Some(param), "{body}: {text}");
    }
    let (_, none) = a.get_json(path).await;
    assert_eq!(none["data"], json!([]), "nothing ran");

    // the engine's queue full: the run waits (429s retried), and a second run is refused
    a.ctl.queue_full.store(true, Ordering::SeqCst);
    let body = json!({"filter": {"q": "number", "limit": 4}, "judge": "fake"});
    let (s, _, bytes) = a.post(path, body.clone()).await;
    assert_eq!(
        s,
        StatusCode::ACCEPTED,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let (s, _, again) = a.post(path, body).await;
    assert_eq!(
        s,
        StatusCode::CONFLICT,
        "{}",
        String::from_utf8_lossy(&again)
    );
    a.ctl.queue_full.store(false, Ordering::SeqCst);
    let started: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        (started["status"].as_str(), started["rows"].as_u64()),
        (Some("running"), Some(4))
    );
    let id = started["id"].as_i64().unwrap();
    let run = finished(&a, id).await;
    assert_eq!(run["status"], "done", "{run}");
    let s = &run["summary"];
    assert_eq!(s["rows"], 4, "{s}");
    for v in s["variants"].as_array().unwrap() {
        assert_eq!(
            (v["answered"].as_u64(), v["errors"].as_u64()),
            (Some(4), Some(0)),
            "{v}"
        );
    }
    // the judge asked each pair in both orders: its agreement rate is measured
    assert!(s["judge_agreement"].is_number(), "{s}");
    let (st, h, html) = a
        .call("GET", &format!("{path}/{id}/report"), None, &[])
        .await;
    assert_eq!(st, StatusCode::OK);
    assert!(h[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let html = String::from_utf8(html).unwrap();
    assert!(
        html.contains("question number"),
        "the replayed inputs are in the report"
    );
    let (_, list) = a.get_json(path).await;
    assert_eq!(list["data"][0]["id"], id);
    assert!(
        list["data"][0].get("report").is_none(),
        "a list leaves the reports out"
    );
    let (s, _) = a.get_json(&format!("{path}/{}", id + 1)).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_answers_of_fan_out_inputs_are_judged_without_asking_the_variants_again() {
    let a = app(Some(SAMPLED)).await;
    for input in ["first input", "second input"] {
        let (s, _, b) = a
            .post("/v1/experiments/greet/fanout", json!({ "input": input }))
            .await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&b));
    }
    // a live sample has one variant's answer: not a pair, left out
    let body = json!({"model": "experiment:greet", "user": "u1",
                      "messages": [{"role": "user", "content": "a live input"}]});
    assert_eq!(a.post("/v1/chat/completions", body).await.0, StatusCode::OK);
    let store = a.state.experiments.ab.as_ref().unwrap().store().clone();
    for _ in 0..500 {
        if store
            .samples("greet", &Default::default())
            .await
            .unwrap()
            .len()
            == 5
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked_before = a.ctl.submitted.lock().unwrap().len();
    let body = json!({"answers": "stored", "judge": "fake"});
    let (s, _, bytes) = a.post("/v1/experiments/greet/evals", body).await;
    assert_eq!(
        s,
        StatusCode::ACCEPTED,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let id = serde_json::from_slice::<Value>(&bytes).unwrap()["id"]
        .as_i64()
        .unwrap();
    let run = finished(&a, id).await;
    assert_eq!(
        (run["status"].as_str(), run["rows"].as_u64()),
        (Some("done"), Some(2)),
        "{run}"
    );
    for v in run["summary"]["variants"].as_array().unwrap() {
        assert_eq!(v["answered"], 2, "{v}");
    }
    // only the judge asked: 2 inputs x 1 variant against the control x 2 orders
    let asked = a.ctl.submitted.lock().unwrap().len() - asked_before;
    assert_eq!(asked, 4);
    let (_, _, html) = a
        .call(
            "GET",
            &format!("/v1/experiments/greet/evals/{id}/report"),
            None,
            &[],
        )
        .await;
    assert!(String::from_utf8_lossy(&html).contains("second input"));
    let (s, _, _) = a
        .post(
            "/v1/experiments/greet/evals",
            json!({"answers": "stored", "filter": {"unit": "u1"}}),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::BAD_REQUEST,
        "no fan-out input among the unit's samples"
    );
}
