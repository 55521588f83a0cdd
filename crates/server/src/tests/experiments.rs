//! The A/B routes over the fake: assignment by the experiment's hash attribute, exposures of
//! whole and streamed answers, fan-out, the dashboard's data routes, experiments from TOML.

use super::*;

const EXPERIMENT: &str = r#"
[[experiment]]
name = "greet"
hash_attribute = "team"
[[experiment.variants]]
id = "a"
system = "Be brief."
max_tokens = 2
[[experiment.variants]]
id = "b"
weight = 0
"#;

/// Per-variant automatic metrics of the experiment: (metric, n, mean) of variant `a`.
async fn auto_metrics(a: &App) -> Vec<(String, u64, f64)> {
    let (s, _, bytes) = a
        .call("GET", "/v1/experiments/greet/results", None, &[])
        .await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    let m = v["variants"][0]["metrics"].as_object().unwrap();
    m.iter()
        .map(|(k, r)| {
            (
                k.clone(),
                r["summary"]["n"].as_u64().unwrap(),
                r["summary"]["mean"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_request_is_assigned_by_the_experiments_hash_attribute_from_metadata() {
    let a = app(Some(EXPERIMENT)).await;
    let msg = json!([{"role": "user", "content": "hi"}]);
    let (s, headers, bytes) = a
        .post("/v1/chat/completions", json!({"model": "experiment:greet", "messages": msg, "metadata": {"team": "t1"}, "user": "u9"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
    let r: WireResponse = serde_json::from_slice(&bytes).unwrap();
    let routing = r.abserve.unwrap();
    assert_eq!(
        (
            routing.variant.as_str(),
            routing.unit.as_deref(),
            routing.in_experiment
        ),
        ("a", Some("t1"), true)
    );
    assert_eq!(headers["x-abserve-variant"], "a");
    assert_eq!(
        r.choices[0].content(),
        Some("he"),
        "the variant's max_tokens"
    );
    let sub = a.ctl.submitted.lock().unwrap().clone();
    assert_eq!(
        String::from_utf8(sub[0].prompt.iter().map(|&t| t as u8).collect()).unwrap(),
        "system: Be brief.\nuser: hi\nassistant:"
    );
    // `user` is not the attribute this experiment hashes: no unit, control, not in the results
    let (_, _, bytes) = a
        .post(
            "/v1/chat/completions",
            json!({"model": "experiment:greet", "messages": msg, "user": "u9"}),
        )
        .await;
    let routing = serde_json::from_slice::<WireResponse>(&bytes)
        .unwrap()
        .abserve
        .unwrap();
    assert_eq!((routing.unit, routing.in_experiment), (None, false));
}

#[tokio::test]
async fn streamed_and_whole_answers_record_the_same_exposure_fields() {
    let a = app(Some(EXPERIMENT)).await;
    let req = |team: &str, stream: bool| json!({"model": "experiment:greet", "messages": [{"role": "user", "content": "hi"}], "metadata": {"team": team}, "stream": stream});
    assert_eq!(
        a.post("/v1/chat/completions", req("t1", false)).await.0,
        StatusCode::OK
    );
    assert_eq!(
        a.post("/v1/chat/completions", req("t2", true)).await.0,
        StatusCode::OK
    );
    let m = auto_metrics(&a).await;
    for name in ["latency_ms", "ttft_ms", "output_tokens", "error"] {
        let (_, n, _) = m
            .iter()
            .find(|x| x.0 == name)
            .unwrap_or_else(|| panic!("{name} missing in {m:?}"));
        assert_eq!(*n, 2, "{name}: one value per exposure, streamed or not");
    }
    assert_eq!(m.iter().find(|x| x.0 == "output_tokens").unwrap().2, 2.0);
    // failures: both ways record the error
    a.ctl.fail.store(true, Ordering::SeqCst);
    assert_eq!(
        a.post("/v1/chat/completions", req("t3", false)).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        a.post("/v1/chat/completions", req("t4", true)).await.0,
        StatusCode::OK
    );
    let m = auto_metrics(&a).await;
    let (_, n, mean) = m.iter().find(|x| x.0 == "error").unwrap();
    assert_eq!((*n, *mean), (4, 0.5), "two of four exposures failed");
}

#[tokio::test]
async fn ready_runs_a_probe_and_reports_the_plan_and_fanout_answers_every_variant() {
    let a = app(Some(EXPERIMENT)).await;
    let (s, _, bytes) = a.call("GET", "/ready", None, &[]).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
    let r: abserve_protocol::abserve::Ready = serde_json::from_slice(&bytes).unwrap();
    assert_eq!((r.status.as_str(), r.model.as_str()), ("ready", "fake"));
    assert_eq!(
        (r.plan.context, r.plan.seq_slots, r.max_queue),
        (fake::CONTEXT, 4, 8)
    );
    let probe = a.ctl.submitted.lock().unwrap().pop().unwrap();
    assert!(
        probe.probe && probe.params.max_tokens == 1,
        "a real 1-token generation in the priority lane"
    );

    let (s, _, bytes) = a
        .post("/v1/experiments/greet/fanout", json!({"input": "hi"}))
        .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
    let f: abserve_protocol::abserve::Fanout = serde_json::from_slice(&bytes).unwrap();
    let outs: Vec<(&str, Option<&str>)> = f
        .results
        .iter()
        .map(|r| (r.variant.as_str(), r.output.as_deref()))
        .collect();
    assert_eq!(outs, [("a", Some("he")), ("b", Some("hello world"))]);
    let mut ranks: Vec<usize> = f.results.iter().map(|r| r.admission_rank).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1]);
}

/// The dashboard: its page and assets are embedded and locked down by a CSP; the JSON it reads
/// (engine state, history, recent exposures) follows the traffic and checks its parameters.
#[tokio::test]
async fn the_dashboard_is_served_with_its_data_routes() {
    let a = app(Some(EXPERIMENT)).await;
    let (s, h, page) = a.call("GET", "/", None, &[]).await;
    assert_eq!(s, StatusCode::OK);
    assert!(h["content-type"].to_str().unwrap().starts_with("text/html"));
    assert!(h["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("script-src 'self'"));
    let page = String::from_utf8(page).unwrap();
    assert!(
        page.contains("/dashboard/app.js")
            && !page.contains("http://")
            && !page.contains("https://"),
        "no CDN"
    );
    for (path, ty) in [
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/app.css", "text/css"),
    ] {
        let (s, h, body) = a.call("GET", path, None, &[]).await;
        assert_eq!(s, StatusCode::OK, "{path}");
        assert!(h["content-type"].to_str().unwrap().starts_with(ty) && !body.is_empty());
    }
    let (_, _, cfg) = a.call("GET", "/dashboard/config.json", None, &[]).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&cfg).unwrap(),
        json!({"auth_required": false})
    );
    for team in ["t1", "t2", "t3", "t4"] {
        let (s, _, _) = a
            .post("/v1/chat/completions", json!({"model": "experiment:greet", "messages": [{"role": "user", "content": "hi"}], "metadata": {"team": team}}))
            .await;
        assert_eq!(s, StatusCode::OK);
    }
    let get = |path: &'static str| {
        let a = &a;
        async move {
            let (s, _, b) = a.call("GET", path, None, &[]).await;
            (s, serde_json::from_slice::<Value>(&b).unwrap())
        }
    };
    let (s, e) = get("/v1/engine").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(e["model"], "fake");
    assert!(
        e["generated_tokens"].is_u64()
            && e["alive"] == true
            && e["running"].is_u64()
            && e["waiting"].is_u64()
    );
    assert_eq!(
        e["kv"]["total"].as_u64().unwrap(),
        e["kv"]["used"].as_u64().unwrap()
            + e["kv"]["cached"].as_u64().unwrap()
            + e["kv"]["free"].as_u64().unwrap()
    );
    assert!(e["memory"]["planned_bytes"].as_u64().unwrap() > 0);
    let (s, hist) = get("/v1/experiments/greet/history?points=2").await;
    assert_eq!(s, StatusCode::OK);
    let points = hist["points"].as_array().unwrap();
    assert_eq!(points.last().unwrap()["units"], 4);
    assert!(points.len() >= 2 && points[0]["units"].as_u64().unwrap() < 4);
    let (s, x) = get("/v1/experiments/greet/exposures?limit=3").await;
    assert_eq!(s, StatusCode::OK);
    let x = x["exposures"].as_array().unwrap();
    assert_eq!(x.len(), 3);
    assert_eq!(x[0]["unit"], "t4", "newest first");
    assert!(x[0].get("prompt").is_none());
    for bad in [
        "/v1/experiments/greet/history?points=0",
        "/v1/experiments/greet/history?points=101",
        "/v1/experiments/greet/exposures?limit=0",
    ] {
        assert_eq!(get(bad).await.0, StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(
        get("/v1/experiments/nobody/history").await.0,
        StatusCode::NOT_FOUND
    );
}

/// An experiment may be written as TOML (`application/toml`), checked by the same rules; other
/// routes still take JSON only.
#[tokio::test]
async fn experiments_are_created_from_toml_by_the_same_rules() {
    let a = app(Some(EXPERIMENT)).await;
    let toml = "name = \"from-toml\"\n[[variants]]\nid = \"a\"\nsystem = \"Be brief.\"\n[[variants]]\nid = \"b\"\n";
    let send = |method: &'static str, path: &'static str, body: &'static str, ty: &'static str| {
        let a = &a;
        async move {
            let req = Request::builder()
                .method(method)
                .uri(path)
                .header("content-type", ty)
                .body(Body::from(body))
                .unwrap();
            let resp = a.router.clone().oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, String::from_utf8_lossy(&bytes).to_string())
        }
    };
    let (s, body) = send("POST", "/v1/experiments", toml, "application/toml").await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["variants"][0]["system"],
        "Be brief."
    );
    let (s, body) = send("PUT", "/v1/experiments/from-toml", "name = \"from-toml\"\nstatus = \"paused\"\n[[variants]]\nid = \"a\"\n[[variants]]\nid = \"b\"\n", "application/toml").await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let (s, body) = send(
        "POST",
        "/v1/experiments",
        "name = \"one\"\n[[variants]]\nid = \"a\"\n",
        "application/toml",
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(body.contains("at least two variants"), "{body}");
    let (s, _) = send("POST", "/v1/experiments", toml, "text/plain").await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (s, _) = send(
        "POST",
        "/v1/chat/completions",
        "model = \"fake\"",
        "application/toml",
    )
    .await;
    assert_eq!(
        s,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "only experiment definitions come as TOML"
    );
}

/// A variant with `fanout_rate` answers exactly the fan-out inputs its hash samples (`skipped`
/// on the others, sent nothing); a `daily_spend_cap` on a model without prices is refused when
/// the experiment is created, naming the field.
#[tokio::test]
async fn fanout_rate_samples_inputs_and_a_cap_needs_prices() {
    let a = app(Some(EXPERIMENT)).await;
    let def = json!({"name": "sampled", "variants": [
        {"id": "all", "max_tokens": 2},
        {"id": "half", "max_tokens": 2, "fanout_rate": 0.5}]});
    let (s, _, bytes) = a.post("/v1/experiments", def).await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let e = a.state.experiments.find("sampled").unwrap();
    let mut seen = [0, 0];
    for i in 0..12 {
        let input = format!("input {i}");
        let before = a.ctl.submitted.lock().unwrap().len();
        let (s, _, bytes) = a
            .post("/v1/experiments/sampled/fanout", json!({ "input": input }))
            .await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
        let f: abserve_protocol::abserve::Fanout = serde_json::from_slice(&bytes).unwrap();
        let half = &f.results[1];
        let sampled = e.variants[1].fans_out(e.seed(), &input);
        seen[sampled as usize] += 1;
        assert_eq!(half.skipped.is_none(), sampled, "{half:?}");
        assert_eq!(half.output.is_some(), sampled, "{half:?}");
        assert!(f.results[0].output.is_some());
        let sent = a.ctl.submitted.lock().unwrap().len() - before;
        assert_eq!(
            sent,
            1 + sampled as usize,
            "a skipped variant is sent nothing"
        );
    }
    assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");

    let capped = json!({"name": "capped", "variants": [
        {"id": "a"}, {"id": "b", "max_tokens": 2, "daily_spend_cap": 1.0}]});
    let (s, _, bytes) = a.post("/v1/experiments", capped).await;
    let body = String::from_utf8_lossy(&bytes);
    assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("variants.b.daily_spend_cap") && body.contains("no prices"),
        "{body}"
    );
}

#[tokio::test]
async fn each_request_reaches_the_engine_in_its_class() {
    use abserve_engine::Class;
    let a = app(Some(EXPERIMENT)).await;
    let msg = json!([{"role": "user", "content": "hi"}]);
    let last = |a: &App| {
        let r = a.ctl.submitted.lock().unwrap().last().cloned().unwrap();
        (r.class, r.priority)
    };
    let ask = |body: Value| a.post("/v1/chat/completions", body);
    let (s, _, _) = ask(json!({"model": "fake", "messages": msg})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(last(&a), (Class::Interactive, 0), "live by default");
    for (tier, class) in [
        ("flex", Class::Batch),
        ("batch", Class::Batch),
        ("fanout", Class::Fanout),
        ("priority", Class::Interactive),
        ("default", Class::Interactive),
    ] {
        let body = json!({"model": "fake", "messages": msg, "service_tier": tier, "priority": 7});
        let (s, _, bytes) = ask(body).await;
        assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
        assert_eq!(last(&a), (class, 7), "{tier}");
    }
    let (s, _, bytes) = a
        .post(
            "/v1/completions",
            json!({"model": "fake", "prompt": "hi", "service_tier": "flex"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(last(&a).0, Class::Batch);
    let n = a.ctl.submitted.lock().unwrap().len();
    for bad in [
        json!({"service_tier": "gold"}),
        json!({"priority": 1u64 << 40}),
    ] {
        let mut body = json!({"model": "fake", "messages": msg});
        body.as_object_mut()
            .unwrap()
            .extend(bad.as_object().unwrap().clone());
        let (s, _, bytes) = ask(body).await;
        assert_eq!(
            s,
            StatusCode::BAD_REQUEST,
            "{}",
            String::from_utf8_lossy(&bytes)
        );
    }
    assert_eq!(
        a.ctl.submitted.lock().unwrap().len(),
        n,
        "a refused request reaches nothing"
    );

    // an experiment's class is its requests' default; a fan-out's is `fanout`
    let def =
        json!({"name": "nightly", "service_tier": "batch", "variants": [{"id": "a"}, {"id": "b"}]});
    let (s, _, bytes) = a.post("/v1/experiments", def).await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let routed = json!({"model": "experiment:nightly", "messages": msg, "user": "u1"});
    ask(routed.clone()).await;
    assert_eq!(last(&a).0, Class::Batch);
    let mut own = routed;
    own["service_tier"] = json!("priority");
    ask(own).await;
    assert_eq!(
        last(&a).0,
        Class::Interactive,
        "the request's own tier wins"
    );
    let (s, _, _) = a
        .post("/v1/experiments/nightly/fanout", json!({"input": "hi"}))
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(last(&a).0, Class::Fanout);
    let (s, _, _) = a
        .post(
            "/v1/experiments/nightly/fanout",
            json!({"input": "hi", "tier": "x"}),
        )
        .await;
    assert_eq!(
        s,
        StatusCode::BAD_REQUEST,
        "an unknown fan-out field is refused"
    );
}

/// An exposure whose write began is written even when its caller is dropped at once: a streaming
/// client that closes on reading an error event drops the stream that records its exposure.
#[tokio::test]
async fn an_exposure_begun_is_written_when_its_caller_is_dropped() {
    let a = app(Some(EXPERIMENT)).await;
    let ab = a.state.experiments.ab.as_ref().unwrap();
    let x = abserve_ab::Exposure {
        variant: "a".into(),
        unit: "u1".into(),
        forced: false,
        latency_ms: None,
        ttft_ms: None,
        output_tokens: None,
        error: Some("the upstream closed the stream".into()),
        constrained: false,
        grammar_complete: None,
        prompt_tokens: None,
        cost: None,
        service_tier: None,
        request_id: None,
        caller: None,
    };
    for _ in 0..20 {
        let mut write = Box::pin(ab.record_exposure("greet".into(), x.clone()));
        assert!(futures::poll!(&mut write).is_pending());
        drop(write);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut n = 0;
    while std::time::Instant::now() < deadline {
        n = ab
            .store()
            .recent_exposures("greet", 100)
            .await
            .unwrap()
            .len();
        if n == 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(n, 20, "exposures whose caller was dropped were lost");
}
