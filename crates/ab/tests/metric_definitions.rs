//! Metric definitions (`[[experiment.metrics]]`, `metric.rs`) through the store on SQLite and
//! PostgreSQL equal GrowthBook's stats engine to 1e-6 on committed fixtures
//! (scripts/metric_fixtures.py): per-unit `binary`, `sum`, `count`, `mean` and `max` values of
//! the same raw events, a percentile cap, and `lower is better` (chance to beat control and the
//! risks flipped as gbstats' `inverse`).

use abserve_ab::testing::Fresh;
use abserve_ab::{parse_file, Exposure, OutcomeEvent};
use serde_json::Value;

mod common;
use common::close;

async fn check(f: &Fresh) {
    let fx: Value = serde_json::from_str(include_str!("fixtures/metric_definitions.json")).unwrap();
    let mut toml = String::from("[[experiment]]\nname = \"defs\"\n");
    for c in fx["cases"].as_array().unwrap() {
        let d = &c["definition"];
        toml += &format!(
            "[[experiment.metrics]]\nname = \"{}\"\naggregation = \"{}\"\ndirection = \"{}\"\n",
            d["name"].as_str().unwrap(),
            d["aggregation"].as_str().unwrap(),
            d["direction"].as_str().unwrap()
        );
        if let Some(p) = d["cap"].as_f64() {
            toml += &format!("cap = {p}\n");
        }
    }
    toml += "[[experiment.variants]]\nid = \"a\"\n[[experiment.variants]]\nid = \"b\"\n";
    let e = parse_file(&toml).unwrap().remove(0);
    e.validate().unwrap();
    let s = f.store().await;
    let names: Vec<&str> = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["definition"]["name"].as_str().unwrap())
        .collect();
    let mut events = vec![];
    for u in fx["events"].as_array().unwrap() {
        let unit = u["unit"].as_str().unwrap();
        let x = Exposure {
            variant: u["variant"].as_str().unwrap().into(),
            unit: unit.into(),
            forced: false,
            latency_ms: Some(1.0),
            ttft_ms: Some(1.0),
            output_tokens: Some(1),
            error: None,
            constrained: false,
            grammar_complete: None,
        };
        s.record_exposure("defs", &x).await.unwrap();
        for v in u["values"].as_array().unwrap() {
            for m in &names {
                events.push(OutcomeEvent {
                    unit: unit.into(),
                    metric: m.to_string(),
                    value: v.as_f64().unwrap(),
                    timestamp: None,
                });
            }
        }
    }
    for (i, chunk) in events.chunks(5000).enumerate() {
        s.record_events("defs", Some(&format!("b{i}")), chunk)
            .await
            .unwrap();
    }
    let r = s.results(&e).await.unwrap();
    for c in fx["cases"].as_array().unwrap() {
        let name = c["definition"]["name"].as_str().unwrap();
        for (i, v) in r.variants.iter().enumerate() {
            let m = &v.metrics[name];
            assert_eq!(
                m.summary.n as u64,
                c["n"][i].as_u64().unwrap(),
                "{name} n of {}",
                v.id
            );
            close(
                m.summary.mean,
                &c["mean"][i],
                &format!("{name} mean of {}", v.id),
            );
            close(
                m.summary.sd.powi(2),
                &c["variance"][i],
                &format!("{name} variance of {}", v.id),
            );
            assert_eq!(m.definition.as_ref().unwrap().name, name);
            match c["cap_value"].as_f64() {
                Some(_) => close(
                    m.cap_value.unwrap(),
                    &c["cap_value"],
                    &format!("{name} cap"),
                ),
                None => assert!(m.cap_value.is_none()),
            }
        }
        let t = &r.variants[1].metrics[name];
        let w = t.vs_control.unwrap();
        close(w.p_value, &c["p_value"], &format!("{name} p"));
        close(w.ci_low, &c["ci_low"], &format!("{name} ci low"));
        close(w.ci_high, &c["ci_high"], &format!("{name} ci high"));
        let b = t.bayesian.unwrap();
        close(
            b.chance_to_beat_control,
            &c["chance_to_win"],
            &format!("{name} chance to win"),
        );
        close(
            b.risk_control,
            &c["risk_control"],
            &format!("{name} risk of control"),
        );
        close(
            b.risk_treatment,
            &c["risk_treatment"],
            &format!("{name} risk of treatment"),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_definitions_equal_gbstats_on_sqlite() {
    let f = Fresh::sqlite("metric_definitions");
    check(&f).await;
    f.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_definitions_equal_gbstats_on_postgres() {
    let f = Fresh::postgres("metric_definitions").await;
    check(&f).await;
    f.drop().await;
}
