//! What the fixture tests share.

use serde_json::Value;

// the fixture comparison of the statistics' tests (one rule for every fixture: 1e-6)
#[path = "../../../statistics/tests/common/mod.rs"]
mod fixtures;
#[allow(unused_imports)]
pub use fixtures::close;

/// The experiment `name` of variants `a` and `b` with one `[[experiment.metrics]]` table per
/// fixture case's `definition` (name, aggregation, direction, and cap and cuped where given).
#[allow(dead_code)]
pub fn experiment_of_cases(name: &str, fx: &Value) -> abserve_ab::Experiment {
    let mut toml = format!("[[experiment]]\nname = \"{name}\"\n");
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
        if d["cuped"].as_bool() == Some(true) {
            toml += "cuped = true\n";
        }
    }
    toml += "[[experiment.variants]]\nid = \"a\"\n[[experiment.variants]]\nid = \"b\"\n";
    let e = abserve_ab::parse_file(&toml).unwrap().remove(0);
    e.validate().unwrap();
    e
}

/// The metric names of the fixture's cases.
#[allow(dead_code)]
pub fn case_names(fx: &Value) -> Vec<&str> {
    fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["definition"]["name"].as_str().unwrap())
        .collect()
}

/// A plain exposure of `unit` to `variant` (automatic metrics all 1, no error).
#[allow(dead_code)]
pub fn exposure(unit: &str, variant: &str) -> abserve_ab::Exposure {
    abserve_ab::Exposure {
        variant: variant.into(),
        unit: unit.into(),
        forced: false,
        latency_ms: Some(1.0),
        ttft_ms: Some(1.0),
        output_tokens: Some(1),
        error: None,
        constrained: false,
        grammar_complete: None,
        prompt_tokens: None,
        cost: None,
        service_tier: None,
        request_id: None,
        caller: None,
    }
}

/// Records `events` into `experiment` in batches of 5,000.
#[allow(dead_code)]
pub async fn record_all(
    s: &abserve_ab::Store,
    experiment: &str,
    events: &[abserve_ab::OutcomeEvent],
) {
    for (i, chunk) in events.chunks(5000).enumerate() {
        s.record_events(experiment, Some(&format!("b{i}")), chunk)
            .await
            .unwrap();
    }
}
