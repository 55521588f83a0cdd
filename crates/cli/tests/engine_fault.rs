//! An engine thread that panics (a fault injected through its `Compute`: the first decode
//! panics when `ABSERVE_TEST_PANIC_AT_DECODE=1`, in a binary built with the cargo feature
//! `fault-injection`, as scripts/test.sh builds it) does not leave a zombie server: the request in
//! flight gets a 500 naming the cause, `/health` fails, and the process exits non-zero with the
//! cause in its log, for a supervisor (Kubernetes' liveness probe, systemd) to restart it.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::{client, post_json, Server, MODEL_ID};

#[tokio::test(flavor = "multi_thread")]
async fn a_panic_on_the_engine_thread_fails_the_request_and_health_and_exits_non_zero() {
    let mut s = Server::start_with_env(
        &["--drain-timeout", "2"],
        &[("ABSERVE_TEST_PANIC_AT_DECODE", "1")],
    );
    let c = client();
    assert_eq!(
        c.get(s.url("/health")).send().await.unwrap().status(),
        200,
        "alive until the first decode"
    );
    let body = json!({"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4});
    let (status, v) = post_json(&c, &s.url("/v1/chat/completions"), body).await;
    assert_eq!(
        status, 500,
        "the injected fault did not fire: build with `--features fault-injection` (scripts/test.sh does): {v}"
    );
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("panicked") && m.contains("injected fault"),
        "{m}"
    );
    // a liveness probe fails from now on: 503 while the server drains, then no server at all
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    match fresh.get(s.url("/health")).send().await {
        Ok(r) => assert_eq!(r.status(), 503, "health after the engine died"),
        Err(e) => assert!(e.is_connect() || e.is_request(), "{e}"),
    }
    let child = s.child.as_mut().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        assert!(
            Instant::now() < deadline,
            "the server did not exit after its engine died"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(matches!(code, Some(c) if c != 0), "exit code {code:?}");
    let log = s
        .log_line("the engine thread died", Duration::from_secs(5))
        .unwrap_or_else(|log| panic!("no cause in the log: {log}"));
    assert!(log.contains("injected fault"), "{log}");
}
