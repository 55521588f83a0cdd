//! Keys with roles over the fake: every `/v1` route tried with every role (the rules' table),
//! a key revoked by editing the keys file, the audit log of admin actions, a key's default class.

use abserve_protocol::Role;

use super::*;
use crate::auth::RULES;
use crate::keys::Keys;

const EXPERIMENT: &str = r#"
[[experiment]]
name = "greet"
[experiment.samples]
rate = 1.0
[[experiment.variants]]
id = "a"
max_tokens = 2
[[experiment.variants]]
id = "b"
"#;

const KEYS: &str = r#"
[[key]]
name = "app"
role = "inference"
key = "sk-inference-1"

[[key]]
name = "rater"
role = "reviewer"
key = "sk-reviewer-1"

[[key]]
name = "ops"
role = "admin"
key = "sk-admin-1"

[[key]]
name = "nightly"
role = "inference"
key = "sk-batch-1"
service_tier = "flex"
"#;

fn key_of(role: Role) -> &'static str {
    match role {
        Role::Inference => "sk-inference-1",
        Role::Reviewer => "sk-reviewer-1",
        Role::Admin => "sk-admin-1",
    }
}

struct Keyed {
    app: App,
    file: PathBuf,
}

impl Drop for Keyed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

async fn keyed() -> Keyed {
    let r: u64 = rand::random();
    let file = std::env::temp_dir().join(format!("abserve-keys-{r:016x}.toml"));
    std::fs::write(&file, KEYS).unwrap();
    let keys = Keys::new(Some("sk-cli-admin".into()), Some(file.clone())).unwrap();
    let app = app_keyed(Some(EXPERIMENT), None, vec![], keys).await;
    Keyed { app, file }
}

impl App {
    async fn as_key(
        &self,
        key: Option<&str>,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Vec<u8>) {
        let bearer = key.map(|k| format!("Bearer {k}"));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(b) = &bearer {
            headers.push(("authorization", b.as_str()));
        }
        let (s, _, bytes) = self.call(method, path, body, &headers).await;
        (s, bytes)
    }
}

/// A request that the route answers with a 2xx when allowed (a fresh experiment name for the
/// writes, so each role's try starts from the same state).
fn request_for(method: &str, template: &str, n: usize) -> (String, Option<Value>) {
    let msg = json!([{"role": "user", "content": "hi"}]);
    let name = format!("made{n}");
    match (method, template) {
        ("POST", "/v1/chat/completions") => (
            template.into(),
            Some(json!({"model": "fake", "messages": msg})),
        ),
        ("POST", "/v1/completions") => (
            template.into(),
            Some(json!({"model": "fake", "prompt": "hi"})),
        ),
        ("POST", "/v1/experiments") => (
            template.into(),
            Some(json!({"name": name, "variants": [{"id": "a"}, {"id": "b"}]})),
        ),
        ("PUT", _) => (
            "/v1/experiments/greet".into(),
            Some(json!({"name": "greet", "variants": [{"id": "a", "max_tokens": 2}, {"id": "b"}]})),
        ),
        ("DELETE", "/v1/units/{unit}") => ("/v1/units/u1".into(), None),
        ("POST", "/v1/experiments/{name}/samples/{id}/review") => (
            "/v1/experiments/greet/samples/1/review".into(),
            Some(json!({"thumbs": true})),
        ),
        ("DELETE", _) => (format!("/v1/experiments/{name}"), None),
        ("POST", "/v1/experiments/{name}/events") => (
            "/v1/experiments/greet/events".into(),
            Some(json!({"events": [{"unit": "u1", "metric": "thumbs_up", "value": 1}]})),
        ),
        ("POST", "/v1/experiments/{name}/evals") => (
            "/v1/experiments/greet/evals".into(),
            Some(json!({"filter": {"limit": 1}})),
        ),
        ("GET", t) if t.starts_with("/v1/experiments/{name}/evals/{id}") => {
            (t.replace("{name}", "greet").replace("{id}", "1"), None)
        }
        ("POST", "/v1/experiments/{name}/fanout") => (
            "/v1/experiments/greet/fanout".into(),
            Some(json!({"input": "hi"})),
        ),
        (_, t) => (t.replace("{name}", "greet"), None),
    }
}

async fn eval_finished(a: &App) {
    for _ in 0..600 {
        let (_, bytes) = a
            .as_key(
                Some("sk-admin-1"),
                "GET",
                "/v1/experiments/greet/evals",
                None,
            )
            .await;
        let runs: Value = serde_json::from_slice(&bytes).unwrap();
        if runs["data"][0]["status"] != "running" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the eval run did not finish in 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_only_the_roles_its_rule_names() {
    let k = keyed().await;
    let a = &k.app;
    // a sample to read and rate (sample 1)
    let routed = json!({"model": "experiment:greet", "user": "u1", "messages": [{"role": "user", "content": "hi"}]});
    let (s, _) = a
        .as_key(
            Some("sk-inference-1"),
            "POST",
            "/v1/chat/completions",
            Some(routed),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    for _ in 0..500 {
        if a.state
            .metrics
            .samples
            .with_label_values(&["written"])
            .get()
            == 1
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut n = 0;
    for &(method, template, allowed, _) in RULES {
        for role in Role::ALL {
            n += 1;
            if method == "DELETE" {
                // something to delete, made by an admin
                let (path, body) = request_for("POST", "/v1/experiments", n);
                let (s, b) = a.as_key(Some("sk-admin-1"), "POST", &path, body).await;
                assert_eq!(s, StatusCode::CREATED, "{}", String::from_utf8_lossy(&b));
            }
            let (path, body) = request_for(method, template, n);
            let (s, bytes) = a.as_key(Some(key_of(role)), method, &path, body).await;
            let text = String::from_utf8_lossy(&bytes);
            if allowed.contains(&role) {
                assert!(s.is_success(), "{role:?} {method} {path}: {s} {text}");
                if template.ends_with("/evals") && method == "POST" {
                    // one run at a time: the next role's try waits for this one
                    eval_finished(a).await;
                }
            } else {
                assert_eq!(s, StatusCode::FORBIDDEN, "{role:?} {method} {path}: {text}");
                let e: ErrorBody = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(e.error.kind.as_deref(), Some("permission_error"));
                assert!(
                    e.error.message.contains(&crate::auth::roles_text(allowed))
                        && e.error.message.contains(role.as_str()),
                    "{text}"
                );
            }
        }
        // no key, a wrong key: 401 everywhere
        let (path, body) = request_for(method, template, 0);
        for key in [None, Some("sk-nobody"), Some("sk-admin-")] {
            let (s, _) = a.as_key(key, method, &path, body.clone()).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{key:?} {method} {path}");
        }
    }
    // --api-key is an admin key
    let (s, _) = a
        .as_key(Some("sk-cli-admin"), "GET", "/v1/audit", None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, bytes) = a.as_key(Some("sk-reviewer-1"), "GET", "/v1/me", None).await;
    assert_eq!(s, StatusCode::OK);
    let me: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        me,
        json!({"name": "rater", "role": "reviewer", "service_tier": null})
    );
}

#[tokio::test]
async fn a_key_taken_out_of_the_file_fails_on_its_next_request() {
    let k = keyed().await;
    let a = &k.app;
    let (s, _) = a
        .as_key(Some("sk-reviewer-1"), "GET", "/v1/experiments", None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let without: String = KEYS.replace("key = \"sk-reviewer-1\"", "key = \"sk-reviewer-2\"");
    std::fs::write(&k.file, without).unwrap();
    let (s, _) = a
        .as_key(Some("sk-reviewer-1"), "GET", "/v1/experiments", None)
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "revoked at once");
    let (s, _) = a
        .as_key(Some("sk-reviewer-2"), "GET", "/v1/experiments", None)
        .await;
    assert_eq!(s, StatusCode::OK, "its replacement works at once");
}

#[tokio::test]
async fn admin_actions_are_in_the_audit_log_with_who_did_them() {
    let k = keyed().await;
    let a = &k.app;
    let def = json!({"name": "audited", "variants": [{"id": "a"}, {"id": "b"}]});
    let (s, _) = a
        .as_key(
            Some("sk-admin-1"),
            "POST",
            "/v1/experiments",
            Some(def.clone()),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = a
        .as_key(Some("sk-admin-1"), "POST", "/v1/experiments", Some(def))
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _) = a
        .as_key(
            Some("sk-cli-admin"),
            "DELETE",
            "/v1/experiments/audited",
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    // refused and read-only calls are not admin actions
    a.as_key(
        Some("sk-reviewer-1"),
        "DELETE",
        "/v1/experiments/greet",
        None,
    )
    .await;
    a.as_key(Some("sk-reviewer-1"), "GET", "/v1/experiments", None)
        .await;
    let (s, bytes) = a.as_key(Some("sk-admin-1"), "GET", "/v1/audit", None).await;
    assert_eq!(s, StatusCode::OK);
    let log: Value = serde_json::from_slice(&bytes).unwrap();
    let rows: Vec<(String, String, String, String, u64)> = log["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert!(e["at"].as_f64().unwrap() > 1.7e9);
            (
                e["who"].as_str().unwrap().into(),
                e["role"].as_str().unwrap().into(),
                e["method"].as_str().unwrap().into(),
                e["path"].as_str().unwrap().into(),
                e["status"].as_u64().unwrap(),
            )
        })
        .collect();
    let row = |w: &str, m: &str, p: &str, s: u64| (w.into(), "admin".into(), m.into(), p.into(), s);
    assert_eq!(
        rows,
        vec![
            row("api-key", "DELETE", "/v1/experiments/audited", 200),
            row("ops", "POST", "/v1/experiments", 409),
            row("ops", "POST", "/v1/experiments", 201),
        ],
        "newest first"
    );
    assert!(
        !String::from_utf8_lossy(&bytes).contains("sk-"),
        "no key in the log"
    );
}

#[tokio::test]
async fn a_keys_class_is_its_requests_default_and_their_own_tier_wins() {
    use abserve_engine::Class;
    let k = keyed().await;
    let a = &k.app;
    let last = |a: &App| a.ctl.submitted.lock().unwrap().last().unwrap().class;
    let msg = json!([{"role": "user", "content": "hi"}]);
    let chat = json!({"model": "fake", "messages": msg});
    let (s, _) = a
        .as_key(
            Some("sk-batch-1"),
            "POST",
            "/v1/chat/completions",
            Some(chat.clone()),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(last(a), Class::Batch);
    let (s, _) = a
        .as_key(
            Some("sk-inference-1"),
            "POST",
            "/v1/chat/completions",
            Some(chat),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(last(a), Class::Interactive);
    let own = json!({"model": "fake", "messages": msg, "service_tier": "priority"});
    a.as_key(
        Some("sk-batch-1"),
        "POST",
        "/v1/chat/completions",
        Some(own),
    )
    .await;
    assert_eq!(last(a), Class::Interactive, "the request's own tier wins");
    let routed = json!({"model": "experiment:greet", "messages": msg, "user": "u1"});
    a.as_key(
        Some("sk-batch-1"),
        "POST",
        "/v1/chat/completions",
        Some(routed),
    )
    .await;
    assert_eq!(last(a), Class::Batch);
    let (s, _) = a
        .as_key(
            Some("sk-batch-1"),
            "POST",
            "/v1/experiments/greet/fanout",
            Some(json!({"input": "hi"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(last(a), Class::Batch, "the key's class over fan-out's");
}

#[tokio::test]
async fn an_inference_key_posts_events_only_for_units_its_own_requests_were_served_for() {
    let k = keyed().await;
    let a = &k.app;
    let msg = json!([{"role": "user", "content": "hi"}]);
    for (key, unit) in [("sk-inference-1", "u1"), ("sk-batch-1", "u2")] {
        let routed = json!({"model": "experiment:greet", "messages": msg, "user": unit});
        let (s, _) = a
            .as_key(Some(key), "POST", "/v1/chat/completions", Some(routed))
            .await;
        assert_eq!(s, StatusCode::OK);
    }
    let events = |units: &[&str]| {
        let e: Vec<Value> = units
            .iter()
            .map(|u| json!({"unit": u, "metric": "thumbs_up", "value": 1}))
            .collect();
        Some(json!({ "events": e }))
    };
    let post = |key: &'static str, units: &[&str]| {
        a.as_key(
            Some(key),
            "POST",
            "/v1/experiments/greet/events",
            events(units),
        )
    };
    let (s, _) = post("sk-inference-1", &["u1"]).await;
    assert_eq!(s, StatusCode::OK, "its own unit");
    // a unit another key's request was served for, and one nobody's was: refused, none stored
    for (key, units) in [
        ("sk-inference-1", &["u1", "u2"][..]),
        ("sk-batch-1", &["u1"][..]),
        ("sk-inference-1", &["u9"][..]),
    ] {
        let (s, bytes) = post(key, units).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{key} {units:?}");
        let e: ErrorBody = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(e.error.kind.as_deref(), Some("permission_error"));
        assert_eq!(e.error.code.as_deref(), Some("not_own_unit"));
        assert!(
            e.error.message.contains("Nothing was stored"),
            "{}",
            e.error.message
        );
    }
    let (s, _) = post("sk-admin-1", &["u9", "u2"]).await;
    assert_eq!(s, StatusCode::OK, "an admin key posts for any unit");
    let (_, bytes) = a
        .as_key(
            Some("sk-admin-1"),
            "GET",
            "/v1/experiments/greet/results",
            None,
        )
        .await;
    let r: Value = serde_json::from_slice(&bytes).unwrap();
    let sum: f64 = r["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| &v["metrics"]["thumbs_up"]["summary"])
        .map(|m| m["mean"].as_f64().unwrap_or(0.0) * m["n"].as_f64().unwrap_or(0.0))
        .sum();
    // u1 (app) and u2 (admin); u9 has no exposure, so no variant counts it
    assert_eq!(sum, 2.0, "{r}");
}
