//! The operator files under deploy/: the Prometheus alert rules pass `promtool check rules` and
//! their unit tests (`promtool test rules`), and every metric they use is one a real
//! `abserve serve` exports.

mod support;

use abserve_protocol::names;

use std::path::PathBuf;
use std::process::Command;

use support::{status, Server};

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(deploy().join("prometheus"))
        .output();
    let out = out.expect("promtool missing: run scripts/setup.sh");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    promtool(&["check", "rules", "alerts.yml"]);
    promtool(&["test", "rules", "alerts_test.yml"]);
}

/// Metric names in PromQL expressions.
fn metrics_used<'a>(exprs: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut names = vec![];
    for line in exprs {
        let mut word = String::new();
        for ch in line.chars().chain([' ']) {
            if ch.is_ascii_alphanumeric() || ch == '_' || ch == ':' {
                word.push(ch);
                continue;
            }
            // a metric is a word followed by `{` or a word that starts abserve_/process_
            if (ch == '{' || word.starts_with("abserve_") || word.starts_with("process_"))
                && !word.is_empty()
                && !names.contains(&word)
            {
                names.push(word.clone());
            }
            word.clear();
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_the_alerts_and_the_dashboard_use_is_exported() {
    let rules = std::fs::read_to_string(deploy().join("prometheus/alerts.yml")).unwrap();
    let mut used = metrics_used(rules.lines().filter_map(|l| l.trim().strip_prefix("expr:")));
    assert!(used.len() >= 8, "{used:?}");
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(deploy().join("grafana/abserve.json")).unwrap(),
    )
    .unwrap();
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["expr"].as_str().unwrap())
        })
        .collect();
    assert!(exprs.len() >= 10);
    used.extend(metrics_used(exprs.into_iter()));
    // per-experiment series exist once an experiment has run
    let dir = std::env::temp_dir().join(format!("abserve-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("e.toml");
    std::fs::write(&file, "[[experiment]]\nname = \"e\"\n[[experiment.variants]]\nid = \"a\"\n[[experiment.variants]]\nid = \"b\"\n").unwrap();
    let s = Server::start(&["--experiments", &file.display().to_string()]);
    let c = reqwest::Client::new();
    let body = serde_json::json!({"model": "experiment:e", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "user": "u"});
    assert_eq!(
        status(c.post(s.url("/v1/chat/completions")).json(&body)).await,
        200
    );
    // the SRM p-value is refreshed in the background (at start, then every 30 s)
    let mut text = String::new();
    for _ in 0..50 {
        text = c
            .get(s.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        // and the guardrails' count of stopped variants (periodic.rs, at start, then every 10 s)
        if text.contains("abserve_experiment_srm_p_value{")
            && text.contains("abserve_experiment_variants_stopped{")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let exported = abserve_protocol::parse_prometheus(&text);
    for name in used {
        // `up` is Prometheus's own, for every scrape target
        if name == "up" {
            continue;
        }
        // device series exist only with layers offloaded (a GPU build); the server's unit test
        // `ready_and_metrics_watch_the_device` checks them exported over a fake device
        if name.starts_with("abserve_device_memory_") {
            let device = [
                names::DEVICE_MEMORY_TOTAL,
                names::DEVICE_MEMORY_FREE,
                names::DEVICE_MEMORY_USED,
                names::DEVICE_MEMORY_USED_BEFORE,
                names::DEVICE_MEMORY_BUDGET,
                names::DEVICE_MEMORY_PLANNED,
            ];
            assert!(
                device.contains(&name.as_str()),
                "{name} is used but abserve does not export it"
            );
            continue;
        }
        // upstream series exist with an upstream configured; tests/python/test_upstreams.py
        // scrapes them from a server with real upstreams
        if name.starts_with("abserve_upstream_") {
            let upstream = [
                names::UPSTREAM_BREAKER_STATE,
                names::UPSTREAM_SATURATED,
                names::UPSTREAM_SATURATION,
                names::UPSTREAM_REQUESTS_IN_FLIGHT,
                names::UPSTREAM_TOKENS_RESERVED,
            ];
            assert!(
                upstream.contains(&name.as_str()),
                "{name} is used but abserve does not export it"
            );
            continue;
        }
        // the worker's job series are exported by `abserve worker --listen`, which
        // scale_out's dead-letter test scrapes and checks
        if name.starts_with("abserve_worker_") {
            let worker = [
                names::WORKER_JOBS,
                names::WORKER_JOBS_IN_HAND,
                names::WORKER_JOB_SECONDS,
            ];
            assert!(
                worker.contains(&name.as_str()),
                "{name} is used but abserve worker does not export it"
            );
            continue;
        }
        let found = exported.get(&name).is_some() || exported.has_prefix(&format!("{name}{{"));
        assert!(found, "{name} is used but abserve does not export it");
    }
}
