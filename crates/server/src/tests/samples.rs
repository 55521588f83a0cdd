//! Sampled conversations over the fake (issue 45): exactly the sampled units' requests are kept,
//! linked to their exposures by the answer's id, redacted before they are written, read back by
//! filter, erased per unit, swept after their retention; a full queue drops samples, counted,
//! never requests.

use super::*;
use crate::experiments::samples::{Pending, SampleQueue, QUEUE};

const SAMPLED: &str = r#"
[[experiment]]
name = "greet"
[experiment.samples]
rate = 0.5
retention_days = 30
redact = ['ACCT-\d+']
[[experiment.variants]]
id = "a"
system = "Be brief."
max_tokens = 8
[[experiment.variants]]
id = "b"
max_tokens = 8
"#;

const PLANTED: &str =
    "I am jane@example.com, call +1 415 555 0132, card 4111 1111 1111 1111, account ACCT-9911";

fn written(a: &App) -> u64 {
    a.state
        .metrics
        .samples
        .with_label_values(&["written"])
        .get()
}

async fn wait_written(a: &App, n: u64) {
    for _ in 0..500 {
        if written(a) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} of {n} samples written", written(a));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_sampled_units_are_kept_redacted_and_linked_to_their_exposures() {
    let a = app(Some(SAMPLED)).await;
    let ab = a.state.experiments.ab.as_ref().unwrap();
    let e = ab.get("greet").unwrap();
    let rules = e.samples.clone().unwrap();
    let units: Vec<String> = (0..40).map(|i| format!("user-{i}")).collect();
    for (i, u) in units.iter().enumerate() {
        let body = json!({"model": "experiment:greet", "user": u, "stream": i % 2 == 1,
                          "messages": [{"role": "user", "content": PLANTED}]});
        let (s, _, bytes) = a.post("/v1/chat/completions", body).await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
    }
    let want: Vec<&String> = units
        .iter()
        .filter(|u| rules.sampled(e.seed(), u))
        .collect();
    assert!((10..30).contains(&want.len()), "{} sampled", want.len());
    wait_written(&a, want.len() as u64).await;

    let store = ab.store();
    let samples = store
        .samples(
            "greet",
            &abserve_ab::SampleQuery {
                limit: Some(500),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut got: Vec<&String> = samples.iter().map(|s| &s.unit).collect();
    got.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(got, want_sorted, "the sampled units, once each");
    // each sample is its exposure's: the same answer id, variant and unit
    let exposures = store.recent_exposures("greet", 500).await.unwrap();
    assert_eq!(exposures.len(), units.len());
    for s in &samples {
        let x = exposures
            .iter()
            .find(|x| x.exposure.request_id.as_deref() == Some(s.request_id.as_str()))
            .unwrap_or_else(|| panic!("no exposure has {}", s.request_id));
        assert_eq!(
            (&x.exposure.unit, &x.exposure.variant),
            (&s.unit, &s.variant)
        );
        assert!(s.request_id.starts_with("chatcmpl-"));
        let text = s.request.to_string() + &s.response.to_string();
        for secret in ["jane@example.com", "555 0132", "4111", "ACCT-9911"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        let asked = s.request["messages"].as_array().unwrap();
        let user = asked.last().unwrap()["content"].as_str().unwrap();
        assert_eq!(
            user,
            "I am [email], call [phone], card [card], account [redacted]"
        );
        // what the variant sent: a's system prompt
        assert_eq!(
            asked.len(),
            if s.variant == "a" { 2 } else { 1 },
            "{asked:?}"
        );
        assert_eq!(s.request["max_tokens"], 8);
        assert_eq!(
            s.response["text"],
            String::from_utf8_lossy(&ANSWER[..8]).as_ref()
        );
        assert_eq!(s.finish_reason.as_deref(), Some("length"));
        assert_eq!(s.output_tokens, Some(8));
    }

    // read over HTTP, filtered
    let (st, _, bytes) = a
        .call(
            "GET",
            "/v1/experiments/greet/samples?variant=a&limit=500",
            None,
            &[],
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
    let page: Value = serde_json::from_slice(&bytes).unwrap();
    let of_a = samples.iter().filter(|s| s.variant == "a").count();
    assert_eq!(page["data"].as_array().unwrap().len(), of_a);
    let (st, _, _) = a
        .call("GET", "/v1/experiments/greet/samples?limit=0", None, &[])
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);

    // erasure of one unit: its samples, exposures and events
    let unit = want[0].clone();
    let ev = json!({"events": [{"unit": unit, "metric": "thumbs_up", "value": 1}]});
    let (st, _, _) = a.post("/v1/experiments/greet/events", ev).await;
    assert_eq!(st, StatusCode::OK);
    let (st, _, bytes) = a
        .call("DELETE", &format!("/v1/units/{unit}"), None, &[])
        .await;
    assert_eq!(st, StatusCode::OK);
    let erased: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        erased,
        json!({"unit": unit, "samples": 1, "exposures": 1, "events": 1, "eval_runs": 0})
    );
    assert!(store
        .recent_exposures("greet", 500)
        .await
        .unwrap()
        .iter()
        .all(|x| x.exposure.unit != unit));

    // the sweep: nothing is old yet; 31 days on, all of it is
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert_eq!(a.state.experiments.sweep_samples(now).await, 0);
    let left = want.len() as u64 - 1;
    assert_eq!(
        a.state
            .experiments
            .sweep_samples(now + 31.0 * 86_400.0)
            .await,
        left
    );

    // deleting the experiment deletes its samples (the sweep would no longer see them)
    let body = json!({"model": "experiment:greet", "user": want[1], "messages": [{"role": "user", "content": "hi"}]});
    a.post("/v1/chat/completions", body).await;
    wait_written(&a, want.len() as u64 + 1).await;
    let q = abserve_ab::SampleQuery::default();
    assert_eq!(store.samples("greet", &q).await.unwrap().len(), 1);
    let (st, _, _) = a.call("DELETE", "/v1/experiments/greet", None, &[]).await;
    assert_eq!(st, StatusCode::OK);
    assert!(store.samples("greet", &q).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_full_queue_drops_samples_counted_and_the_daily_cap_holds() {
    let a = app(Some(SAMPLED)).await;
    let ab = a.state.experiments.ab.as_ref().unwrap();
    let metrics = a.state.metrics.clone();
    let q = SampleQueue::new(ab.store().clone(), metrics.clone());
    let mut rules = ab.get("greet").unwrap().samples.unwrap();
    rules.daily_cap = Some(5);
    let rules = Arc::new(rules);
    let one = |i: usize| Pending {
        sample: abserve_ab::Sample {
            id: 0,
            experiment: "greet".into(),
            variant: "a".into(),
            unit: format!("u{i}"),
            request_id: format!("r{i}"),
            input_id: None,
            at: 0.0,
            request: json!({}),
            response: json!({"text": "x"}),
            finish_reason: None,
            error: None,
            prompt_tokens: None,
            output_tokens: None,
            latency_ms: None,
            review: None,
        },
        rules: rules.clone(),
    };
    // 3 samples another replica (or this one before a restart) wrote today count too
    let earlier: Vec<abserve_ab::Sample> = (0..3).map(|i| one(100_000 + i).sample).collect();
    ab.store().record_samples(&earlier).await.unwrap();
    // a single-threaded runtime: the writer cannot run until this test yields
    for i in 0..QUEUE + 10 {
        q.offer(one(i));
    }
    let count = |o: &str| metrics.samples.with_label_values(&[o]).get();
    assert_eq!(count("queue_full"), 10);
    for _ in 0..500 {
        if count("written") + count("daily_cap") >= QUEUE as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        (count("written"), count("daily_cap")),
        (2, QUEUE as u64 - 2)
    );
    let kept = ab
        .store()
        .samples("greet", &Default::default())
        .await
        .unwrap();
    assert_eq!(kept.len(), 5);
}
