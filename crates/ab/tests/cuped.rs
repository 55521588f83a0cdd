//! CUPED (`cuped = true` on a metric definition, `cuped.rs`) through the store on SQLite and
//! PostgreSQL equals GrowthBook's regression adjustment (gbstats 0.8.0) to 1e-6 on committed
//! fixtures (scripts/cuped_fixtures.py): units with events before their first exposure (inside
//! the 14-day lookback window and older ones, which must be left out) and after it, under
//! `sum`, `binary`, `count`, `mean` (lower is better) and a capped `sum`: θ, pre and adjusted
//! means, the variance reduction, Welch's p-value and interval on the adjusted means, chance to
//! beat control and risks; the unadjusted read-out beside it counts only post-exposure events.

use std::time::{SystemTime, UNIX_EPOCH};

use abserve_ab::testing::Fresh;
use abserve_ab::{parse_file, OutcomeEvent};
use serde_json::Value;

mod common;
use common::close;

async fn check(f: &Fresh) {
    let fx: Value = serde_json::from_str(include_str!("fixtures/cuped.json")).unwrap();
    let e = common::experiment_of_cases("cuped", &fx);
    let s = f.store().await;
    let names = common::case_names(&fx);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut events = vec![];
    for u in fx["units"].as_array().unwrap() {
        let unit = u["unit"].as_str().unwrap();
        let x = common::exposure(unit, u["variant"].as_str().unwrap());
        s.record_exposure("cuped", &x).await.unwrap();
        let pre = u["pre"].as_array().unwrap().iter().map(|p| {
            let days = p[0].as_f64().unwrap();
            (Some(now - days * 86_400.0), p[1].as_f64().unwrap())
        });
        let post = u["post"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| (None, v.as_f64().unwrap()));
        for (timestamp, value) in pre.chain(post) {
            for m in &names {
                events.push(OutcomeEvent {
                    unit: unit.into(),
                    metric: m.to_string(),
                    value,
                    timestamp,
                });
            }
        }
    }
    common::record_all(&s, "cuped", &events).await;
    let r = s.results(&e).await.unwrap();
    for c in fx["cases"].as_array().unwrap() {
        let name = c["definition"]["name"].as_str().unwrap();
        let at = |what: &str| format!("{name}: {what}");
        for (i, v) in r.variants.iter().enumerate() {
            let m = &v.metrics[name];
            assert_eq!(m.summary.n as u64, c["n"][i].as_u64().unwrap(), "{name} n");
            close(m.summary.mean, &c["post_mean"][i], &at("post mean"));
        }
        if c["cap_value"].is_f64() {
            close(
                r.variants[1].metrics[name].cap_value.unwrap(),
                &c["cap_value"],
                &at("cap"),
            );
        }
        let t = &r.variants[1].metrics[name];
        assert!(r.variants[0].metrics[name].cuped.is_none());
        let cu = t
            .cuped
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: no cuped"));
        close(cu.theta, &c["theta"], &at("theta"));
        close(
            cu.control_pre_mean,
            &c["pre_mean"][0],
            &at("control pre mean"),
        );
        close(cu.pre_mean, &c["pre_mean"][1], &at("pre mean"));
        close(
            cu.control_mean,
            &c["adjusted_mean"][0],
            &at("control adjusted"),
        );
        close(cu.mean, &c["adjusted_mean"][1], &at("adjusted mean"));
        close(
            cu.variance_reduction,
            &c["variance_reduction"],
            &at("variance reduction"),
        );
        let w = cu.vs_control.unwrap();
        close(w.p_value, &c["p_value"], &at("p"));
        close(w.ci_low, &c["ci_low"], &at("ci low"));
        close(w.ci_high, &c["ci_high"], &at("ci high"));
        let u = t.vs_control.unwrap();
        close(u.p_value, &c["unadjusted_p_value"], &at("unadjusted p"));
        let b = cu.bayesian.unwrap();
        close(b.chance_to_beat_control, &c["chance_to_win"], &at("chance"));
        close(b.risk_control, &c["risk_control"], &at("risk control"));
        close(
            b.risk_treatment,
            &c["risk_treatment"],
            &at("risk treatment"),
        );
        assert!(cu.sequential.is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuped_equals_gbstats_on_sqlite() {
    let f = Fresh::sqlite("cuped");
    check(&f).await;
    f.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuped_equals_gbstats_on_postgres() {
    let f = Fresh::postgres("cuped").await;
    check(&f).await;
    f.drop().await;
}

#[test]
fn cuped_is_refused_on_automatic_metrics_and_the_window_must_be_positive() {
    for (body, says) in [
        ("name = \"latency_ms\"\ncuped = true", "automatic metric"),
        (
            "name = \"x\"\ncuped = true\nlookback_days = 0",
            "lookback_days",
        ),
    ] {
        let toml = format!(
            "[[experiment]]\nname = \"e\"\n[[experiment.metrics]]\n{body}\n\
             [[experiment.variants]]\nid = \"a\"\n[[experiment.variants]]\nid = \"b\"\n"
        );
        let err = parse_file(&toml).unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
    }
}
