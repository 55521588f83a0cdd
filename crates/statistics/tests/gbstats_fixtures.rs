//! The statistics people may peek at equal GrowthBook's own stats engine (gbstats), confseq and
//! statsmodels to 1e-6 on committed fixtures (scripts/gbstats_fixtures.py).

use abserve_statistics::{
    bayesian, benjamini_hochberg, half_width, holm, sequential, summarize, welch, RatioMoments,
};
use serde_json::Value;

mod common;
use common::{close, floats};

fn fixtures() -> Value {
    serde_json::from_str(include_str!("fixtures/gbstats.json")).unwrap()
}

#[test]
fn sequential_intervals_equal_gbstats_and_confseq() {
    for (i, case) in fixtures()["means"].as_array().unwrap().iter().enumerate() {
        let (c, t) = (
            summarize(&floats(&case["control"])),
            summarize(&floats(&case["treatment"])),
        );
        let tuning = case["tuning"].as_f64().unwrap();
        let s = sequential(&c, &t, 0.05, tuning).unwrap();
        let r = &case["sequential"];
        close(
            s.ci_low,
            &r["ci_low"],
            &format!("case {i} sequential ci_low"),
        );
        close(
            s.ci_high,
            &r["ci_high"],
            &format!("case {i} sequential ci_high"),
        );
        close(
            s.p_value,
            &r["p_value"],
            &format!("case {i} always-valid p"),
        );
        let var = c.sd.powi(2) / c.n as f64 + t.sd.powi(2) / t.n as f64;
        close(
            half_width(var, (c.n + t.n) as f64, 0.05, tuning),
            &r["confseq_half_width"],
            &format!("case {i} confseq width"),
        );
    }
}

#[test]
fn bayesian_read_out_equals_gbstats() {
    for (i, case) in fixtures()["means"].as_array().unwrap().iter().enumerate() {
        let (c, t) = (
            summarize(&floats(&case["control"])),
            summarize(&floats(&case["treatment"])),
        );
        let b = bayesian(&c, &t, 0.05).unwrap();
        let r = &case["bayesian"];
        close(
            b.chance_to_beat_control,
            &r["chance_to_win"],
            &format!("case {i} chance to win"),
        );
        close(b.uplift, &r["uplift"], &format!("case {i} uplift"));
        close(b.uplift_sd, &r["uplift_sd"], &format!("case {i} uplift sd"));
        close(b.ci_low, &r["ci_low"], &format!("case {i} credible low"));
        close(b.ci_high, &r["ci_high"], &format!("case {i} credible high"));
        close(
            b.risk_control,
            &r["risk_control"],
            &format!("case {i} risk of control"),
        );
        close(
            b.risk_treatment,
            &r["risk_treatment"],
            &format!("case {i} risk of treatment"),
        );
        // gbstats' frequentist two-sided test on the absolute difference is Welch's
        let w = welch(&floats(&case["control"]), &floats(&case["treatment"])).unwrap();
        close(
            w.p_value,
            &case["welch"]["p_value"],
            &format!("case {i} welch p"),
        );
        close(
            w.ci_low,
            &case["welch"]["ci_low"],
            &format!("case {i} welch ci_low"),
        );
        close(
            w.ci_high,
            &case["welch"]["ci_high"],
            &format!("case {i} welch ci_high"),
        );
    }
}

#[test]
fn ratio_metrics_equal_gbstats_delta_method() {
    let pairs = |v: &Value| -> Vec<(f64, f64)> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap()))
            .collect()
    };
    for (i, case) in fixtures()["ratio"].as_array().unwrap().iter().enumerate() {
        let c = RatioMoments::of(&pairs(&case["control"])).summary();
        let t = RatioMoments::of(&pairs(&case["treatment"])).summary();
        close(
            c.mean,
            &case["control_ratio"],
            &format!("ratio {i} control"),
        );
        close(
            c.sd.powi(2),
            &case["control_variance"],
            &format!("ratio {i} control variance"),
        );
        close(
            t.mean,
            &case["treatment_ratio"],
            &format!("ratio {i} treatment"),
        );
        close(
            t.sd.powi(2),
            &case["treatment_variance"],
            &format!("ratio {i} treatment variance"),
        );
        let w = abserve_statistics::welch_summaries(&c, &t).unwrap();
        close(w.p_value, &case["p_value"], &format!("ratio {i} p"));
        close(w.ci_low, &case["ci_low"], &format!("ratio {i} ci_low"));
        close(w.ci_high, &case["ci_high"], &format!("ratio {i} ci_high"));
        let s = sequential(&c, &t, 0.05, 5000.0).unwrap();
        close(
            s.ci_low,
            &case["sequential_ci_low"],
            &format!("ratio {i} sequential ci_low"),
        );
        close(
            s.ci_high,
            &case["sequential_ci_high"],
            &format!("ratio {i} sequential ci_high"),
        );
        close(
            s.p_value,
            &case["sequential_p_value"],
            &format!("ratio {i} sequential p"),
        );
        let b = bayesian(&c, &t, 0.05).unwrap();
        close(
            b.chance_to_beat_control,
            &case["chance_to_win"],
            &format!("ratio {i} chance to win"),
        );
        close(
            b.risk_treatment,
            &case["risk_treatment"],
            &format!("ratio {i} risk"),
        );
    }
}

#[test]
fn adjusted_p_values_equal_statsmodels() {
    for case in fixtures()["adjust"].as_array().unwrap() {
        let p = floats(&case["p"]);
        for (got, want) in holm(&p).iter().zip(case["holm"].as_array().unwrap()) {
            close(*got, want, "holm");
        }
        for (got, want) in benjamini_hochberg(&p)
            .iter()
            .zip(case["bh"].as_array().unwrap())
        {
            close(*got, want, "benjamini-hochberg");
        }
    }
}
