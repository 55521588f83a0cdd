//! The operations routes over the fake: the OpenAPI document, `/ready` and `/metrics` watching
//! an offloaded device.

use super::*;

#[tokio::test]
async fn the_openapi_document_lists_every_route_with_its_error_answers() {
    let a = app(None).await;
    let (s, _, bytes) = a.call("GET", "/openapi.json", None, &[]).await;
    assert_eq!(s, StatusCode::OK);
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/experiments",
        "/v1/experiments/{name}",
        "/v1/experiments/{name}/fanout",
        "/v1/experiments/{name}/events",
        "/v1/experiments/{name}/results",
        "/v1/experiments/{name}/history",
        "/v1/experiments/{name}/exposures",
        "/v1/engine",
        "/health",
        "/ready",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(paths.contains_key(p), "{p} missing");
    }
    let chat = &doc["paths"]["/v1/chat/completions"]["post"];
    for code in ["200", "400", "413", "415", "429", "503"] {
        assert!(chat["responses"].get(code).is_some(), "chat lacks {code}");
    }
    assert!(chat["responses"]["200"]["content"]
        .get("text/event-stream")
        .is_some());
    // the one Sampling struct, flattened into every request body
    assert_eq!(
        doc["components"]["schemas"]["Sampling"]["properties"]["temperature"]["maximum"],
        2.0
    );
    let common = doc["components"]["schemas"]["Common"].to_string();
    assert!(common.contains("#/components/schemas/Sampling"), "{common}");
}

/// With layers on a device: `/ready` reports the device and fails once abserve's use of it
/// passes the device budget; `/metrics` exports its memory and plan.
#[tokio::test]
async fn ready_and_metrics_watch_the_device() {
    let before = 100 << 20;
    let device = Arc::new(abserve_engine::device::FakeDevice::new(
        "Fake0",
        1 << 30,
        before,
    ));
    let a = app_with(None, Some(device.clone())).await;
    let (s, _, body) = a.call("GET", "/ready", None, &[]).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let r: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(r["device"]["name"], "Fake0");
    assert_eq!(r["device"]["budget_bytes"], fake::DEVICE_BUDGET);
    assert_eq!(r["device"]["used_before_bytes"], before);
    let planned = r["device"]["planned_bytes"].as_u64().unwrap();
    assert!(planned > 1 << 20 && planned <= fake::DEVICE_BUDGET, "{r}");
    // abserve's use within the budget: ready
    device.set_used(before + fake::DEVICE_BUDGET);
    assert_eq!(a.call("GET", "/ready", None, &[]).await.0, StatusCode::OK);
    let (_, _, m) = a.call("GET", "/metrics", None, &[]).await;
    let m = abserve_protocol::parse_prometheus(&String::from_utf8_lossy(&m));
    assert_eq!(
        m.get("abserve_device_memory_total_bytes{device=\"Fake0\"}"),
        Some((1u64 << 30) as f64)
    );
    assert_eq!(
        m.get("abserve_device_memory_used_bytes{device=\"Fake0\"}"),
        Some((before + fake::DEVICE_BUDGET) as f64)
    );
    assert_eq!(
        m.get("abserve_device_memory_budget_bytes{device=\"Fake0\"}"),
        Some(fake::DEVICE_BUDGET as f64)
    );
    assert_eq!(
        m.get("abserve_device_memory_planned_bytes{device=\"Fake0\"}"),
        Some(planned as f64)
    );
    assert_eq!(
        m.get("abserve_device_memory_free_bytes{device=\"Fake0\"}"),
        Some(((1u64 << 30) - before - fake::DEVICE_BUDGET) as f64)
    );
    assert_eq!(
        m.get("abserve_device_memory_used_before_start_bytes{device=\"Fake0\"}"),
        Some(before as f64)
    );
    // one byte more: not ready, and the message says every number
    device.set_used(before + fake::DEVICE_BUDGET + 1);
    let (s, _, body) = a.call("GET", "/ready", None, &[]).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    let text = String::from_utf8_lossy(&body);
    for n in [
        before + fake::DEVICE_BUDGET + 1,
        1 << 30,
        before,
        fake::DEVICE_BUDGET,
        fake::DEVICE_BUDGET + 1,
    ] {
        assert!(text.contains(&n.to_string()), "{n} missing from {text}");
    }
}
