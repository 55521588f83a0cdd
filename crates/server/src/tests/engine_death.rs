//! An engine that meets an impossible state fails the request concerned with a 500 naming it;
//! an engine thread that died (a caught panic, see `abserve_engine`'s `engine_loop`) fails
//! `/health` with its cause, and `serve` stops with that cause as its error, so the process
//! exits non-zero for a supervisor to restart it.

use super::*;

#[tokio::test]
async fn an_impossible_engine_state_is_a_500_naming_it() {
    let a = app(None).await;
    a.ctl.internal.store(true, Ordering::SeqCst);
    let (status, _, body) = a
        .post(
            "/v1/chat/completions",
            json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let e: ErrorBody = serde_json::from_slice(&body).unwrap();
    assert!(
        e.error.message.contains("running sequence 7") && e.error.message.contains("is gone"),
        "{}",
        e.error.message
    );
}

#[tokio::test]
async fn a_dead_engine_fails_health_with_its_cause_and_stops_serve_with_an_error() {
    let a = app(None).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(crate::serve(
        a.state.clone(),
        "127.0.0.1:0".parse().unwrap(),
        std::future::pending(),
        move |addr| {
            let _ = tx.send(addr);
        },
    ));
    let _addr = rx.await.unwrap();
    assert_eq!(a.call("GET", "/health", None, &[]).await.0, StatusCode::OK);
    *a.ctl.failure.lock().unwrap() = Some("the engine thread panicked: injected".into());
    a.ctl.dead.store(true, Ordering::SeqCst);
    let (status, _, body) = a.call("GET", "/health", None, &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("panicked: injected"), "{text}");
    let out = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("serve stops once the engine died")
        .unwrap();
    let e = out.expect_err("serve ends with an error");
    assert!(e.to_string().contains("panicked: injected"), "{e}");
}
