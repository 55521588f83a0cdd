//! What answers cost (models served elsewhere at a price, issue 43), on both backends: `cost` as
//! an automatic metric, a bandit's cost read-out, the fan-out spend per variant and day.

use super::*;

on_both!(
    cost_is_an_automatic_metric_of_priced_answers_only,
    a_bandit_reads_out_each_arms_cost_per_unit,
    fanout_spend_adds_up_per_variant_and_day_and_survives_reopening,
);

/// Variant a's answers have a price (a model served elsewhere), b's none: `cost` is a's mean
/// over its units and b has no value of it; exposures read back with their prompt tokens and cost.
async fn cost_is_an_automatic_metric_of_priced_answers_only(f: &Fresh) {
    let s = f.store().await;
    for (i, cost) in [(0, 0.002), (1, 0.004)] {
        let mut x = exposure("a", &format!("u{i}"), 10.0);
        (x.prompt_tokens, x.cost) = (Some(100 + i), Some(cost));
        s.record_exposure("aa", &x).await.unwrap();
        s.record_exposure("aa", &exposure("b", &format!("v{i}"), 10.0))
            .await
            .unwrap();
    }
    let r = s.results(&exp()).await.unwrap();
    let a = &r.variants[0].metrics["cost"].summary;
    assert_eq!(a.n, 2);
    assert!((a.mean - 0.003).abs() < 1e-12, "{}", a.mean);
    assert!(r.variants[1]
        .metrics
        .get("cost")
        .is_none_or(|m| m.summary.n == 0));
    let recent = s.recent_exposures("aa", 8).await.unwrap();
    let u1 = recent.iter().find(|x| x.exposure.unit == "u1").unwrap();
    assert_eq!(
        (u1.exposure.prompt_tokens, u1.exposure.cost),
        (Some(101), Some(0.004))
    );
    let v1 = recent.iter().find(|x| x.exposure.unit == "v1").unwrap();
    assert_eq!((v1.exposure.prompt_tokens, v1.exposure.cost), (None, None));
}

/// A bandit's arms carry their cost per unit (the mean of each unit's mean cost, in one period
/// before any update) beside the decision metric; an arm without priced answers has none.
async fn a_bandit_reads_out_each_arms_cost_per_unit(f: &Fresh) {
    let s = f.store().await;
    let e = parse_file(
        "[[experiment]]\nname = \"aa\"\nmode = \"bandit\"\ndecision_metric = \"reward\"\n\
         [[experiment.variants]]\nid = \"a\"\n[[experiment.variants]]\nid = \"b\"\n",
    )
    .unwrap()
    .remove(0);
    // a: unit u0 two answers (0.001, 0.003: mean 0.002), u1 one (0.006); b unpriced
    for (u, cost) in [("u0", 0.001), ("u0", 0.003), ("u1", 0.006)] {
        let mut x = exposure("a", u, 10.0);
        x.cost = Some(cost);
        s.record_exposure("aa", &x).await.unwrap();
    }
    s.record_exposure("aa", &exposure("b", "v0", 10.0))
        .await
        .unwrap();
    let b = s.bandit_results(&e).await.unwrap().unwrap();
    let a = b.arms[0].cost.expect("a's cost");
    assert_eq!(a.units, 2);
    assert!((a.mean - 0.004).abs() < 1e-12, "{}", a.mean);
    // the variance of the mean: the units' sample variance (0.002, 0.006: 8e-6) over 2
    assert!((a.variance - 4e-6).abs() < 1e-15, "{}", a.variance);
    assert_eq!(b.arms[1].cost, None);
}

/// Concurrent adds all count; each (variant, day) has its own sum; a reopened store has them.
async fn fanout_spend_adds_up_per_variant_and_day_and_survives_reopening(f: &Fresh) {
    let s = f.store().await;
    let mut adds = tokio::task::JoinSet::new();
    for i in 0..20 {
        let s = s.clone();
        adds.spawn(async move {
            let day = if i % 4 == 0 {
                "2026-12-07"
            } else {
                "2026-12-06"
            };
            s.add_fanout_spend("e", "paid", day, 0.25).await.unwrap();
        });
    }
    adds.join_all().await;
    s.add_fanout_spend("e", "other", "2026-12-06", 1.0)
        .await
        .unwrap();
    drop(s);
    let s = f.store().await;
    assert_eq!(
        s.fanout_spent("e", "paid", "2026-12-06").await.unwrap(),
        3.75
    );
    assert_eq!(
        s.fanout_spent("e", "paid", "2026-12-07").await.unwrap(),
        1.25
    );
    assert_eq!(
        s.fanout_spent("e", "other", "2026-12-06").await.unwrap(),
        1.0
    );
    assert_eq!(
        s.fanout_spent("e", "paid", "2026-12-08").await.unwrap(),
        0.0
    );
}
