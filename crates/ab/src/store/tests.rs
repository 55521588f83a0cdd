//! One test suite, run on both backends: every test below runs once on SQLite and once on a
//! fresh PostgreSQL database.

use super::*;
use crate::experiment::parse_file;
use crate::testing::Fresh;
use rand::{Rng, SeedableRng};

fn exp() -> Experiment {
    parse_file("[[experiment]]\nname = \"aa\"\n[[experiment.variants]]\nid = \"a\"\n[[experiment.variants]]\nid = \"b\"\n").unwrap().remove(0)
}

fn event(unit: &str, metric: &str, value: f64) -> OutcomeEvent {
    OutcomeEvent {
        unit: unit.into(),
        metric: metric.into(),
        value,
        timestamp: None,
    }
}

fn exposure(variant: &str, unit: &str, latency: f64) -> Exposure {
    Exposure {
        variant: variant.into(),
        unit: unit.into(),
        forced: false,
        latency_ms: Some(latency),
        ttft_ms: Some(10.0),
        output_tokens: Some(20),
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

/// Runs `$test(fresh)` on SQLite and on PostgreSQL.
macro_rules! on_both {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let f = crate::testing::Fresh::sqlite(stringify!($test));
                super::$test(&f).await;
                f.drop().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let f = crate::testing::Fresh::postgres(stringify!($test)).await;
                super::$test(&f).await;
                f.drop().await;
            }
        }
    )*};
}

on_both!(
    experiments_and_events_survive_reopening_and_batches_count_once,
    of_two_creates_of_one_name_exactly_one_succeeds,
    results_attribute_events_to_the_units_variant_and_skip_forced,
    sql_aggregates_equal_the_statistics_of_every_value,
    a_batch_retried_concurrently_through_another_connection_is_stored_once,
    ratio_metrics_history_and_adjustments_come_from_the_database,
    constrained_answers_give_each_variant_its_share_finished_inside_the_grammar,
    automatic_metrics_are_one_value_per_unit_unless_asked_per_request,
);

// what answers of models with prices cost (issue 43)
mod cost;
// sampled conversations and the audit log (issue 45)
mod samples;

/// A unit of a sends 3 requests (latencies 10, 20, 60), another 1 (100); b's two units 1 each.
/// Per unit (the default) a's latency is the mean of the units' means, (30 + 100) / 2, over 2
/// observations; per request (labelled so) the mean of the 4 exposures, 47.5.
async fn automatic_metrics_are_one_value_per_unit_unless_asked_per_request(f: &Fresh) {
    let s = f.store().await;
    for (v, u, lat) in [
        ("a", "u1", 10.0),
        ("a", "u1", 20.0),
        ("a", "u1", 60.0),
        ("a", "u2", 100.0),
        ("b", "u3", 40.0),
        ("b", "u4", 50.0),
    ] {
        s.record_exposure("aa", &exposure(v, u, lat)).await.unwrap();
    }
    let unit = s.results(&exp()).await.unwrap();
    assert_eq!(unit.analysis, Analysis::Unit);
    let a = unit.variants[0].metrics["latency_ms"].summary;
    assert_eq!((a.n, a.mean), (2, 65.0));
    assert_eq!(unit.variants[0].metrics["error"].summary.n, 2);
    let request = s.results_by(&exp(), Analysis::Request).await.unwrap();
    assert_eq!(request.analysis, Analysis::Request);
    let a = request.variants[0].metrics["latency_ms"].summary;
    assert_eq!((a.n, a.mean), (4, 47.5));
    assert_eq!((unit.variants[0].exposures, unit.variants[0].units), (4, 2));
}

/// Variant a answers under a grammar (3 of 4 finish inside it), b freely: `grammar_complete` is
/// a's share, b has no value of it; exposures read back with both fields.
async fn constrained_answers_give_each_variant_its_share_finished_inside_the_grammar(f: &Fresh) {
    let s = f.store().await;
    for i in 0..8 {
        let mut x = exposure(if i % 2 == 0 { "a" } else { "b" }, &format!("u{i}"), 10.0);
        if i % 2 == 0 {
            x.constrained = true;
            x.grammar_complete = Some(i != 6);
            x.service_tier = Some(abserve_protocol::Class::Batch);
        }
        s.record_exposure("aa", &x).await.unwrap();
    }
    let r = s.results(&exp()).await.unwrap();
    let a = &r.variants[0].metrics["grammar_complete"].summary;
    assert_eq!((a.n, a.mean), (4, 0.75));
    let b = r.variants[1].metrics.get("grammar_complete");
    assert!(b.is_none_or(|m| m.summary.n == 0), "b answered freely");
    let recent = s.recent_exposures("aa", 8).await.unwrap();
    let six = recent.iter().find(|x| x.exposure.unit == "u6").unwrap();
    assert_eq!(
        (six.exposure.constrained, six.exposure.grammar_complete),
        (true, Some(false))
    );
    let one = recent.iter().find(|x| x.exposure.unit == "u1").unwrap();
    assert_eq!(
        (one.exposure.constrained, one.exposure.grammar_complete),
        (false, None)
    );
    // the class each ran in, read back (issue 44)
    assert_eq!(
        (six.exposure.service_tier, one.exposure.service_tier),
        (Some(abserve_protocol::Class::Batch), None)
    );
}

async fn experiments_and_events_survive_reopening_and_batches_count_once(f: &Fresh) {
    let e = exp();
    {
        let s = f.store().await;
        assert_eq!(s.schema_version().await.unwrap(), 11);
        s.put_experiment(&e).await.unwrap();
        let ev = vec![event("u1", "clicked", 1.0)];
        assert_eq!(
            s.record_events("aa", Some("batch-1"), &ev).await.unwrap(),
            1
        );
        assert_eq!(
            s.record_events("aa", Some("batch-1"), &ev).await.unwrap(),
            0,
            "a retried batch is not stored twice"
        );
        assert_eq!(s.record_events("aa", None, &ev).await.unwrap(), 1);
    }
    let s = f.store().await;
    assert_eq!(s.experiment("aa").await.unwrap(), Some(e.clone()));
    assert_eq!(s.experiments().await.unwrap(), vec![e]);
    assert_eq!(s.count_events("aa").await.unwrap(), 2);
    assert!(s.delete_experiment("aa").await.unwrap());
    assert!(!s.delete_experiment("aa").await.unwrap());
    assert_eq!(s.experiment("aa").await.unwrap(), None);
}

async fn of_two_creates_of_one_name_exactly_one_succeeds(f: &Fresh) {
    let (s1, s2) = (f.store().await, f.store().await);
    let e = exp();
    let mut other = e.clone();
    other.coverage = 0.5;
    let (a, b) = tokio::join!(s1.create_experiment(&e), s2.create_experiment(&other));
    assert!(
        a.unwrap() ^ b.unwrap(),
        "exactly one of two concurrent creates succeeds"
    );
    let stored = s1.experiment("aa").await.unwrap().unwrap();
    assert!(stored == e || stored == other);
    assert!(!s2.create_experiment(&e).await.unwrap(), "the name exists");
}

async fn results_attribute_events_to_the_units_variant_and_skip_forced(f: &Fresh) {
    let e = exp();
    let s = f.store().await;
    for i in 0..40 {
        let variant = if i % 2 == 0 { "a" } else { "b" };
        s.record_exposure("aa", &exposure(variant, &format!("u{i}"), 100.0 + i as f64))
            .await
            .unwrap();
        let value = if variant == "b" {
            2.0 + (i % 3) as f64
        } else {
            1.0 + (i % 3) as f64
        };
        s.record_events("aa", None, &[event(&format!("u{i}"), "score", value)])
            .await
            .unwrap();
    }
    // a later exposure of u0 to the other variant does not move it; a forced one is not counted
    s.record_exposure("aa", &exposure("b", "u0", 1.0))
        .await
        .unwrap();
    let forced = Exposure {
        variant: "b".into(),
        unit: "qa".into(),
        forced: true,
        latency_ms: None,
        ttft_ms: None,
        output_tokens: None,
        error: None,
        constrained: false,
        grammar_complete: None,
        prompt_tokens: None,
        cost: None,
        service_tier: None,
        request_id: None,
        caller: None,
    };
    s.record_exposure("aa", &forced).await.unwrap();
    s.record_events(
        "aa",
        None,
        &[
            event("qa", "score", 100.0),
            event("never-exposed", "score", 100.0),
        ],
    )
    .await
    .unwrap();
    let r = s.results(&e).await.unwrap();
    assert_eq!((r.variants[0].units, r.variants[1].units), (20, 20));
    assert_eq!((r.variants[0].exposures, r.variants[1].exposures), (20, 21));
    assert!(!r.srm.as_ref().unwrap().mismatch);
    let b = &r.variants[1].metrics["score"];
    assert_eq!(b.summary.n, 20);
    assert!(b.vs_control.unwrap().diff > 0.9);
    assert!(r.variants[0].metrics["score"].vs_control.is_none());
    assert_eq!(r.variants[0].metrics["latency_ms"].summary.n, 20);
    assert_eq!(r.variants[1].metrics["error"].summary.mean, 0.0);
    assert_eq!(
        s.units("aa").await.unwrap(),
        [("a".to_string(), 20), ("b".to_string(), 20)].into()
    );
}

/// The database's aggregates give the statistics that the values themselves give.
async fn sql_aggregates_equal_the_statistics_of_every_value(f: &Fresh) {
    let e = exp();
    let s = f.store().await;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    let mut scores: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut latencies: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for i in 0..300 {
        let v = if rng.gen_bool(0.5) { "a" } else { "b" };
        let unit = format!("u{i}");
        let latency = rng.gen_range(50.0..150.0);
        let mut x = exposure(v, &unit, latency);
        if rng.gen_bool(0.1) {
            x.error = Some("boom".into());
        }
        s.record_exposure("aa", &x).await.unwrap();
        latencies.entry(v).or_default().push(latency);
        // several events per unit: the unit's value is their mean
        let k = rng.gen_range(1..4);
        let vals: Vec<f64> = (0..k)
            .map(|_| rng.gen_range(0.0..10.0) + if v == "b" { 0.5 } else { 0.0 })
            .collect();
        let evs: Vec<_> = vals.iter().map(|&x| event(&unit, "score", x)).collect();
        s.record_events("aa", Some(&format!("batch-{i}")), &evs)
            .await
            .unwrap();
        scores
            .entry(v)
            .or_default()
            .push(vals.iter().sum::<f64>() / k as f64);
    }
    let r = s.results(&e).await.unwrap();
    for (i, v) in ["a", "b"].iter().enumerate() {
        for (metric, values) in [("score", &scores), ("latency_ms", &latencies)] {
            let got = r.variants[i].metrics[metric].summary;
            let want = abserve_statistics::summarize(&values[v]);
            assert_eq!(got.n, want.n, "{metric} {v}");
            for (g, w) in [
                (got.mean, want.mean),
                (got.sd, want.sd),
                (got.ci_low, want.ci_low),
            ] {
                assert!(
                    (g - w).abs() <= 1e-9 * w.abs().max(1.0),
                    "{metric} {v}: {g} vs {w}"
                );
            }
        }
    }
    let want = abserve_statistics::welch(&scores["a"], &scores["b"]).unwrap();
    let got = r.variants[1].metrics["score"].vs_control.unwrap();
    assert!((got.p_value - want.p_value).abs() < 1e-9 && (got.diff - want.diff).abs() < 1e-9);
}

/// A ratio metric's aggregates equal the delta method on every unit's sums; the history ends
/// at the current results; several comparisons get adjusted p-values.
async fn ratio_metrics_history_and_adjustments_come_from_the_database(f: &Fresh) {
    let mut e = exp();
    e.ratios.push(crate::experiment::RatioMetric {
        name: "tokens_per_success".into(),
        numerator: "output_tokens".into(),
        denominator: "success".into(),
    });
    e.variants.push(e.variants[1].clone());
    e.variants[2].id = "c".into();
    let s = f.store().await;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut pairs: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for i in 0..240 {
        let v = ["a", "b", "c"][i % 3];
        let unit = format!("u{i}");
        let mut tokens = 0.0;
        for _ in 0..rng.gen_range(1..3) {
            let mut x = exposure(v, &unit, 100.0);
            let t = rng.gen_range(5..50);
            x.output_tokens = Some(t);
            tokens += t as f64;
            s.record_exposure("aa", &x).await.unwrap();
        }
        // some units never succeed (denominator 0), some twice
        let successes = rng.gen_range(0..3);
        let evs: Vec<_> = (0..successes)
            .map(|_| event(&unit, "success", 1.0))
            .collect();
        if !evs.is_empty() {
            s.record_events("aa", None, &evs).await.unwrap();
        }
        pairs.entry(v).or_default().push((tokens, successes as f64));
    }
    let r = s.results(&e).await.unwrap();
    for (i, v) in ["a", "b", "c"].iter().enumerate() {
        let got = &r.variants[i].metrics["tokens_per_success"];
        let want = abserve_statistics::RatioMoments::of(&pairs[v]).summary();
        assert_eq!(got.summary.n, want.n);
        for (g, w) in [(got.summary.mean, want.mean), (got.summary.sd, want.sd)] {
            assert!(
                (g - w).abs() <= 1e-9 * w.abs().max(1.0),
                "ratio {v}: {g} vs {w}"
            );
        }
        assert_eq!(got.ratio.as_ref().unwrap().denominator, "success");
        if i > 0 {
            let want_p = abserve_statistics::welch_summaries(
                &abserve_statistics::RatioMoments::of(&pairs["a"]).summary(),
                &want,
            )
            .unwrap()
            .p_value;
            assert!((got.vs_control.unwrap().p_value - want_p).abs() < 1e-9);
            assert!(got.sequential.is_some() && got.bayesian.is_some());
            let adj = got.adjusted.expect("several comparisons are adjusted");
            assert!(
                adj.holm >= got.vs_control.unwrap().p_value
                    && adj.bh >= got.vs_control.unwrap().p_value
            );
        }
    }
    // 2 treatments x (output_tokens, tokens_per_success); latency, ttft, error and success
    // (1.0 per unit that has it) are constant, so they cannot be compared
    assert_eq!(r.comparisons, 4);
    assert!(
        r.variants[1].metrics["latency_ms"].vs_control.is_none()
            && r.variants[1].metrics["latency_ms"].adjusted.is_none()
    );
    let h = s.history(&e, 6).await.unwrap();
    assert!(h.len() >= 6 && h.len() <= 8, "{} points", h.len());
    assert!(h
        .windows(2)
        .all(|w| w[0].units < w[1].units && w[0].at < w[1].at));
    let last = h.last().unwrap();
    assert_eq!(last.units, 240);
    assert_eq!(
        last.results.variants[1].metrics["tokens_per_success"]
            .summary
            .mean,
        r.variants[1].metrics["tokens_per_success"].summary.mean
    );
    assert!(
        h[0].units < 240
            && h[0].results.variants.iter().map(|v| v.units).sum::<u64>() == h[0].units
    );
}

async fn a_batch_retried_concurrently_through_another_connection_is_stored_once(f: &Fresh) {
    let (s1, s2) = (f.store().await, f.store().await);
    let ev: Vec<_> = (0..50)
        .map(|i| event(&format!("u{i}"), "m", i as f64))
        .collect();
    let (a, b) = tokio::join!(
        s1.record_events("aa", Some("same"), &ev),
        s2.record_events("aa", Some("same"), &ev)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        a + b,
        50,
        "one of the two stored the batch, the other nothing ({a}, {b})"
    );
    assert_eq!(s2.count_events("aa").await.unwrap(), 50);
}

/// Stores made before sqlx (rusqlite, `user_version` 1) open with their rows.
#[tokio::test]
async fn a_store_from_before_sqlx_keeps_its_rows() {
    let f = Fresh::sqlite("legacy");
    let Fresh::Sqlite(dir) = &f else {
        unreachable!()
    };
    std::fs::create_dir_all(dir).unwrap();
    let opts = SqliteConnectOptions::new()
        .filename(dir.join("abserve.db"))
        .create_if_missing(true);
    let pool = SqlitePool::connect_with(opts).await.unwrap();
    let old =
        include_str!("../../migrations/sqlite/0001_initial.sql").replace("IF NOT EXISTS ", "");
    sqlx::raw_sql(&old).execute(&pool).await.unwrap();
    sqlx::query("PRAGMA user_version = 1")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO experiments VALUES ('aa', $1, 0)")
        .bind(serde_json::to_string(&exp()).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let s = f.store().await;
    assert_eq!(s.experiments().await.unwrap(), vec![exp()]);
    assert_eq!(s.schema_version().await.unwrap(), 11);
    f.drop().await;
}

/// A change made through one handle is announced to a watcher on another (PostgreSQL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_announces_experiment_changes() {
    let f = Fresh::postgres("watch").await;
    let (a, b) = (f.store().await, f.store().await);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = b
        .watch(move || {
            let _ = tx.send(());
        })
        .await
        .unwrap()
        .expect("PostgreSQL can be watched");
    a.put_experiment(&exp()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("notified within 10 s")
        .unwrap();
    a.delete_experiment("aa").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("notified within 10 s")
        .unwrap();
    task.abort();
    assert!(
        Fresh::sqlite("watch")
            .store()
            .await
            .watch(|| ())
            .await
            .unwrap()
            .is_none(),
        "SQLite has nothing to watch"
    );
    f.drop().await;
}

/// A full disk fails writes; it must not leave a pooled connection inside a transaction (it would
/// hold SQLite's write lock, and writes answered as done on it would never be committed): once
/// space returns, writes succeed and everything acknowledged is there after a reopen. SQLite
/// only (PostgreSQL's disk is not ours to fill); mounts a small tmpfs, so it needs root, as CI
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_leaves_no_transaction_open() {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("abserve-store-full-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&dir)
        .status();
    assert!(
        mounted.as_ref().is_ok_and(|s| s.success()),
        "mounting a tmpfs needs root (CI runs as root): {mounted:?}"
    );
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _unmount = Unmount(dir.clone());
    let data = dir.join("data");
    let events = |n: usize| -> Vec<OutcomeEvent> {
        (0..n)
            .map(|i| event(&format!("u{i}"), "score", i as f64))
            .collect()
    };
    let s = Store::open(&data).await.unwrap();
    s.create_experiment(&exp()).await.unwrap();
    let mut stored = s.record_events("aa", None, &events(100)).await.unwrap();
    let mut created = vec![];
    let filler = dir.join("filler");
    for round in 0..8 {
        let mut f = std::fs::File::create(&filler).unwrap();
        while f.write_all(&[0u8; 64 * 1024]).is_ok() {}
        while f.write_all(&[0u8; 512]).is_ok() {}
        drop(f);
        for _ in 0..3 {
            let e = s
                .record_events("aa", None, &events(10_000))
                .await
                .unwrap_err();
            assert_eq!(e.condition(), StoreCondition::Full, "round {round}: {e}");
        }
        // small writes may fit in space the WAL already holds; what is acknowledged must last
        let mut more = exp();
        more.name = format!("more{round}");
        match s.create_experiment(&more).await {
            Ok(_) => created.push(more.name),
            Err(e) => assert_eq!(e.condition(), StoreCondition::Full, "round {round}: {e}"),
        }
        std::fs::remove_file(&filler).unwrap();
        let n = s.record_events("aa", None, &events(1_000)).await;
        stored += n.unwrap_or_else(|e| panic!("round {round}: space returned, yet: {e}"));
    }
    drop(s);
    let s = Store::open(&data).await.unwrap();
    assert_eq!(s.count_events("aa").await.unwrap(), stored as u64);
    for name in created {
        assert!(
            s.experiment(&name).await.unwrap().is_some(),
            "{name} was acknowledged"
        );
    }
}
