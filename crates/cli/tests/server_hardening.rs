//! The nine findings of the hostile-input review (issue 11), each against a real `abserve serve`:
//! every test failed before its fix.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{client, metric, status, Server, MODEL_ID};

fn experiment(name: &str, variants: Value) -> Value {
    json!({"name": name, "variants": variants})
}

/// Polls `/health` every 50 ms while `work` runs; returns the slowest answer.
async fn slowest_health_while<F: std::future::Future>(
    s: &Server,
    work: F,
) -> (Duration, F::Output) {
    let c = client();
    let url = s.url("/health");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poll = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let t = Instant::now();
                let r = c.get(&url).send().await.unwrap();
                assert_eq!(r.status(), 200);
                worst = worst.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            worst
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let out = work.await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    (poll.await.unwrap(), out)
}

#[tokio::test(flavor = "multi_thread")]
async fn finding1_a_template_that_renders_100_mb_is_refused_and_health_stays_fast() {
    let s = Server::start(&[]);
    let c = client();
    let bomb = experiment(
        "bomb",
        json!([{"id": "a", "template": "{{ 'x' * 100000000 }}"}, {"id": "b"}]),
    );
    let loops = experiment(
        "loops",
        json!([{"id": "a", "template": "{% for i in range(100000) %}{% for j in range(1000) %}{{ input }}{% endfor %}{% endfor %}"}, {"id": "b"}]),
    );
    let (worst, statuses) = slowest_health_while(&s, async {
        let tries = (0..4).map(|i| {
            let body = if i % 2 == 0 {
                bomb.clone()
            } else {
                loops.clone()
            };
            c.post(s.url("/v1/experiments")).json(&body).send()
        });
        futures::future::join_all(tries)
            .await
            .into_iter()
            .map(|r| r.unwrap().status().as_u16())
            .collect::<Vec<_>>()
    })
    .await;
    assert_eq!(
        statuses,
        [400, 400, 400, 400],
        "hostile templates are refused at creation"
    );
    assert!(
        worst < Duration::from_secs(1),
        "/health took {worst:?} while templates rendered"
    );
    assert_eq!(status(c.get(s.url("/v1/experiments/bomb"))).await, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn finding2_twenty_thousand_messages_are_refused_and_health_stays_fast() {
    let s = Server::start(&[]);
    let c = client();
    let messages: Vec<Value> = (0..20_000)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "hi"}))
        .collect();
    let body = json!({"model": MODEL_ID, "messages": messages, "max_tokens": 1});
    let (worst, answers) = slowest_health_while(&s, async {
        let tries = (0..4).map(|_| c.post(s.url("/v1/chat/completions")).json(&body).send());
        let mut out = vec![];
        for r in futures::future::join_all(tries).await {
            let r = r.unwrap();
            out.push((r.status().as_u16(), r.json::<Value>().await.unwrap()));
        }
        out
    })
    .await;
    for (status, body) in answers {
        assert_eq!(status, 400);
        assert_eq!(body["error"]["param"], "messages");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("1024"),
            "{body}"
        );
    }
    assert!(
        worst < Duration::from_secs(1),
        "/health took {worst:?} during the hostile requests"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn finding3_variant_settings_are_checked_by_the_request_rules_when_created() {
    let s = Server::start(&[]);
    let c = client();
    let stops: Vec<String> = (0..1000).map(|i| format!("s{i}")).collect();
    let cases = [
        (json!({"temperature": 40}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"stop": [""]}), "stop"),
        (json!({"stop": stops}), "stop"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_tokens": 100000}), "max_tokens"),
    ];
    for (i, (settings, param)) in cases.into_iter().enumerate() {
        let mut a = json!({"id": "a"});
        a.as_object_mut()
            .unwrap()
            .extend(settings.as_object().unwrap().clone());
        let r = c
            .post(s.url("/v1/experiments"))
            .json(&experiment(&format!("e{i}"), json!([a, {"id": "b"}])))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{settings}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            body["error"]["param"],
            format!("variants.a.{param}"),
            "{settings}: {body}"
        );
    }
    // a variant that passes is served
    let ok = experiment(
        "fine",
        json!([{"id": "a", "temperature": 0.5, "stop": ["\n"], "max_tokens": 4}, {"id": "b"}]),
    );
    assert_eq!(
        status(c.post(s.url("/v1/experiments")).json(&ok)).await,
        201
    );
    let r = c
        .post(s.url("/v1/chat/completions"))
        .header("x-abserve-variant", "a")
        .json(&json!({"model": "experiment:fine", "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn finding4_cross_site_writes_are_refused_and_cors_is_off_unless_allowed() {
    let s = Server::start(&[]);
    let c = client();
    let body = experiment("csrf", json!([{"id": "a"}, {"id": "b"}])).to_string();
    // what a page elsewhere can send without a preflight: a text/plain form post
    let r = c
        .post(s.url("/v1/experiments"))
        .header("content-type", "text/plain")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("application/json"));
    assert_eq!(
        status(c.get(s.url("/v1/experiments/csrf"))).await,
        404,
        "nothing was created"
    );
    let events = json!([{"unit": "u", "metric": "m", "value": 1}]).to_string();
    let r = c
        .post(s.url("/v1/experiments/csrf/events"))
        .body(events)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    // the preflight a JSON post needs gets no CORS permission
    let pre = c
        .request(reqwest::Method::OPTIONS, s.url("/v1/experiments"))
        .header("origin", "http://evil.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap();
    assert!(pre.headers().get("access-control-allow-origin").is_none());
    drop(s);
    // a dashboard origin can be allowed explicitly
    let s = Server::start(&["--cors-origin", "http://dash.example"]);
    let pre = |origin: &'static str| {
        c.request(reqwest::Method::OPTIONS, s.url("/v1/experiments"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type")
            .send()
    };
    let ok = pre("http://dash.example").await.unwrap();
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "http://dash.example"
    );
    assert!(pre("http://evil.example")
        .await
        .unwrap()
        .headers()
        .get("access-control-allow-origin")
        .is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn finding5_random_paths_do_not_grow_the_metrics() {
    let s = Server::start(&["--api-key", "k"]);
    let c = client();
    let series = |text: &str| text.lines().filter(|l| !l.starts_with('#')).count();
    let get_metrics = || s.metrics();
    // one of each kind first, so every label that can appear exists
    for p in [
        "/v1/nope",
        "/nope",
        "/v1/experiments/w",
        "/v1/experiments/w/results",
    ] {
        c.get(s.url(p)).send().await.unwrap();
    }
    c.get(s.url("/v1/models")).send().await.unwrap();
    get_metrics().await;
    let before = get_metrics().await;
    // unauthenticated: experiment names in the path (matched routes, 401) and unknown paths (404)
    let paths: Vec<String> = (0..3000)
        .map(|i| match i % 3 {
            0 => format!("/v1/experiments/x{i}"),
            1 => format!("/v1/experiments/x{i}/results"),
            _ => format!("/r{i}/{}", i * 7),
        })
        .collect();
    for chunk in paths.chunks(100) {
        let tries = chunk.iter().map(|p| c.get(s.url(p)).send());
        for r in futures::future::join_all(tries).await {
            assert!(matches!(r.unwrap().status().as_u16(), 401 | 404));
        }
    }
    let after = get_metrics().await;
    assert_eq!(
        series(&after),
        series(&before),
        "the number of series is constant"
    );
    assert!(
        metric(
            &after,
            "abserve_requests_total{endpoint=\"experiments_name\",status=\"401\"}"
        )
        .unwrap()
            >= 1000.0
    );
    assert!(
        metric(
            &after,
            "abserve_requests_total{endpoint=\"unmatched\",status=\"404\"}"
        )
        .unwrap()
            >= 1000.0
    );
    assert!(!after.contains("x10"), "no raw path is a label");
    assert!(after.len() < 2 * before.len());
}

/// Reads from `stream` until the server closes it; the time that took.
fn time_to_close(mut stream: TcpStream, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(t.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(t.elapsed()),
            Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn finding6_slow_clients_are_closed_and_shutdown_ends_within_the_drain_timeout() {
    let mut s = Server::start(&["--header-read-timeout", "1", "--drain-timeout", "2"]);
    let addr = s.base.trim_start_matches("http://").to_string();
    // half a request line, never finished: closed after the header-read timeout
    let mut loris = TcpStream::connect(&addr).unwrap();
    loris
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let closed = tokio::task::spawn_blocking(move || time_to_close(loris, Duration::from_secs(20)))
        .await
        .unwrap();
    assert!(
        closed.is_some_and(|d| d < Duration::from_secs(10)),
        "a half-sent head was not closed: {closed:?}"
    );
    // headers without the body they announce hold a request open; SIGTERM still ends the process
    let mut half = TcpStream::connect(&addr).unwrap();
    half.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let code = tokio::task::spawn_blocking(move || {
        let c = s.terminate();
        (c, s)
    })
    .await
    .unwrap();
    let (code, s) = code;
    assert_eq!(code, Some(0));
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "exit took {:?} with --drain-timeout 2",
        t.elapsed()
    );
    s.log_line(
        "drain timeout of 2s reached: cutting 1 open connections",
        Duration::from_secs(10),
    )
    .unwrap_or_else(|log| panic!("no drain-timeout line in the log: {log}"));
    drop(half);
}

#[tokio::test(flavor = "multi_thread")]
async fn finding7_a_fanout_is_queued_whole_or_refused_with_the_reason() {
    let s = Server::start(&["--max-sequences", "4", "--max-queue", "4"]);
    let c = client();
    let variants = |n: usize| {
        Value::Array(
            (0..n)
                .map(|i| json!({"id": format!("v{i}"), "max_tokens": 3}))
                .collect(),
        )
    };
    assert_eq!(
        status(
            c.post(s.url("/v1/experiments"))
                .json(&experiment("wide", variants(10)))
        )
        .await,
        201
    );
    assert_eq!(
        status(
            c.post(s.url("/v1/experiments"))
                .json(&experiment("six", variants(6)))
        )
        .await,
        201
    );
    let r = c
        .post(s.url("/v1/experiments/wide/fanout"))
        .json(&json!({"input": "Hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        400,
        "10 variants never fit 4 slots + 4 queued: not a 429 to retry forever"
    );
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("4 sequence slots + 4 queued"),
        "{body}"
    );
    // six fit the slots and the queue: accepted whole, every variant answers
    let r = c
        .post(s.url("/v1/experiments/six/fanout"))
        .json(&json!({"input": "Hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let f: Value = r.json().await.unwrap();
    let results = f["results"].as_array().unwrap();
    assert_eq!(results.len(), 6);
    assert!(
        results
            .iter()
            .all(|x| x["error"].is_null() && x["completion_tokens"].as_u64() >= Some(1)),
        "{f}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn finding8_events_in_the_documented_list_form_are_accepted() {
    let s = Server::start(&[]);
    let c = client();
    assert_eq!(
        status(
            c.post(s.url("/v1/experiments"))
                .json(&experiment("ev", json!([{"id": "a"}, {"id": "b"}])))
        )
        .await,
        201
    );
    let list = json!([{"unit": "u1", "metric": "clicks", "value": 1}, {"unit": "u2", "metric": "clicks", "value": 0}]);
    let r = c
        .post(s.url("/v1/experiments/ev/events"))
        .json(&list)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let b: Value = r.json().await.unwrap();
    assert_eq!(
        (b["accepted"].as_u64(), b["stored"].as_u64()),
        (Some(2), Some(2))
    );
    let one = json!({"unit": "u3", "metric": "clicks", "value": 1});
    assert_eq!(
        status(c.post(s.url("/v1/experiments/ev/events")).json(&one)).await,
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn finding9_the_experiments_file_wins_at_start_unless_stored_definitions_are_kept() {
    let dir = std::env::temp_dir().join(format!("abserve-precedence-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("experiments.toml");
    std::fs::write(&file, "[[experiment]]\nname = \"p\"\n[[experiment.variants]]\nid = \"a\"\n[[experiment.variants]]\nid = \"b\"\n").unwrap();
    let data = dir.join("data");
    let (file_s, data_s) = (file.display().to_string(), data.display().to_string());
    let c = client();
    let weights = |s: &Server| {
        let url = s.url("/v1/experiments/p");
        let c = c.clone();
        async move {
            c.get(url)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()["variants"][1]["weight"]
                .as_f64()
                .unwrap()
        }
    };
    let changed = json!({"name": "p", "variants": [{"id": "a"}, {"id": "b", "weight": 3}]});
    {
        let s = Server::start(&["--experiments", &file_s, "--data-dir", &data_s]);
        assert_eq!(
            status(c.put(s.url("/v1/experiments/p")).json(&changed)).await,
            200
        );
        assert_eq!(weights(&s).await, 3.0);
    }
    {
        let s = Server::start(&["--experiments", &file_s, "--data-dir", &data_s]);
        assert_eq!(
            weights(&s).await,
            1.0,
            "by default the file's definition wins at start"
        );
        assert!(
            s.log
                .lock()
                .unwrap()
                .contains("replacing stored definitions"),
            "and the log says so"
        );
        assert_eq!(
            status(c.put(s.url("/v1/experiments/p")).json(&changed)).await,
            200
        );
    }
    {
        let s = Server::start(&[
            "--experiments",
            &file_s,
            "--data-dir",
            &data_s,
            "--keep-stored-experiments",
        ]);
        assert_eq!(
            weights(&s).await,
            3.0,
            "--keep-stored-experiments keeps the HTTP change"
        );
        assert!(s
            .log
            .lock()
            .unwrap()
            .contains("kept the stored definitions of [\"p\"]"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
