//! Metric definitions (`[[experiment.metrics]]`, `metric.rs`) through the store on SQLite and
//! PostgreSQL equal GrowthBook's stats engine to 1e-6 on committed fixtures
//! (scripts/metric_fixtures.py): per-unit `binary`, `sum`, `count`, `mean` and `max` values of
//! the same raw events, a percentile cap, and `lower is better` (chance to beat control and the
//! risks flipped as gbstats' `inverse`); and a `binary` metric whose events are 1 or 0, where a
//! unit converts only when one of its values is not 0 (220 units have only 0s).

use abserve_ab::testing::Fresh;
use abserve_ab::OutcomeEvent;
use serde_json::Value;

mod common;
use common::close;

async fn check(f: &Fresh) {
    let fx: Value = serde_json::from_str(include_str!("fixtures/metric_definitions.json")).unwrap();
    let e = common::experiment_of_cases("defs", &fx);
    let s = f.store().await;
    let names = common::case_names(&fx);
    let mut events = vec![];
    for u in fx["events"].as_array().unwrap() {
        let unit = u["unit"].as_str().unwrap();
        let x = common::exposure(unit, u["variant"].as_str().unwrap());
        s.record_exposure("defs", &x).await.unwrap();
        for v in u["values"].as_array().unwrap() {
            for m in names.iter().filter(|m| **m != "thumbs_up") {
                events.push(OutcomeEvent {
                    unit: unit.into(),
                    metric: m.to_string(),
                    value: v.as_f64().unwrap(),
                    timestamp: None,
                });
            }
        }
    }
    for u in fx["thumbs_up_events"].as_array().unwrap() {
        for v in u["values"].as_array().unwrap() {
            events.push(OutcomeEvent {
                unit: u["unit"].as_str().unwrap().into(),
                metric: "thumbs_up".into(),
                value: v.as_f64().unwrap(),
                timestamp: None,
            });
        }
    }
    common::record_all(&s, "defs", &events).await;
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
