//! The statistics equal scipy's to 1e-6 on committed fixtures (scripts/stats_fixtures.py).

use abserve_statistics::{srm, welch};
use serde_json::Value;

mod common;
use common::floats;

fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-6 * b.abs().max(1.0),
        "{what}: {a} vs scipy {b}"
    );
}

#[test]
fn welch_and_chi_squared_equal_scipy() {
    let fx: Value = serde_json::from_str(include_str!("fixtures/scipy_stats.json")).unwrap();
    for case in fx["welch"].as_array().unwrap() {
        let c = welch(&floats(&case["control"]), &floats(&case["treatment"])).unwrap();
        close(c.t, case["t"].as_f64().unwrap(), "t");
        close(c.df, case["df"].as_f64().unwrap(), "df");
        close(c.p_value, case["p_value"].as_f64().unwrap(), "p");
        close(c.ci_low, case["ci_low"].as_f64().unwrap(), "ci_low");
        close(c.ci_high, case["ci_high"].as_f64().unwrap(), "ci_high");
    }
    for case in fx["chisquare"].as_array().unwrap() {
        let obs: Vec<u64> = case["observed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        let s = srm(&obs, &floats(&case["weights"])).unwrap();
        close(s.chi2, case["chi2"].as_f64().unwrap(), "chi2");
        close(s.p_value, case["p_value"].as_f64().unwrap(), "chi2 p");
    }
}

#[test]
fn paired_statistics_equal_scipy_and_statsmodels() {
    use abserve_statistics::{mcnemar, paired_t, sign_test};
    let fx: Value = serde_json::from_str(include_str!("fixtures/paired_stats.json")).unwrap();
    for case in fx["ttest_rel"].as_array().unwrap() {
        let r = paired_t(&floats(&case["control"]), &floats(&case["treatment"])).unwrap();
        close(r.t, case["t"].as_f64().unwrap(), "paired t");
        close(r.df, case["df"].as_f64().unwrap(), "paired df");
        close(r.p_value, case["p_value"].as_f64().unwrap(), "paired p");
        close(r.ci_low, case["ci_low"].as_f64().unwrap(), "paired ci_low");
        close(
            r.ci_high,
            case["ci_high"].as_f64().unwrap(),
            "paired ci_high",
        );
    }
    let bools = |v: &Value| -> Vec<bool> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_bool().unwrap())
            .collect()
    };
    for case in fx["mcnemar"].as_array().unwrap() {
        let r = mcnemar(&bools(&case["control"]), &bools(&case["treatment"]));
        close(r.p_value, case["p_value"].as_f64().unwrap(), "mcnemar p");
    }
    for case in fx["sign"].as_array().unwrap() {
        let u = |k: &str| case[k].as_u64().unwrap();
        let r = sign_test(u("wins"), u("losses"), u("ties"));
        close(r.p_value, case["p_value"].as_f64().unwrap(), "sign test p");
    }
}
