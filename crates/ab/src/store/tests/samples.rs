//! Sampled conversations and the audit log (issue 45), on both backends: samples written and
//! read back by every filter, newest first and paged; the retention delete; a unit erased in one
//! experiment or all; audit entries newest first; the units served to a key (its exposures).

use std::collections::BTreeSet;

use super::*;
use crate::{AuditEntry, Sample, SampleQuery};

on_both!(
    samples_read_back_by_every_filter_newest_first,
    old_samples_are_deleted_and_a_unit_is_erased_everywhere_or_in_one_experiment,
    audit_entries_read_back_newest_first,
    units_served_to_a_key_are_those_its_exposures_name,
    a_dataset_reads_every_page_newest_first_up_to_its_limit,
    an_eval_run_is_running_until_finished_with_its_summary_and_report,
    reviews_of_different_fields_at_the_same_moment_keep_every_field,
);

fn sample(experiment: &str, variant: &str, unit: &str, text: &str, error: Option<&str>) -> Sample {
    Sample {
        id: 0,
        experiment: experiment.into(),
        variant: variant.into(),
        unit: unit.into(),
        request_id: format!("chatcmpl-{unit}-{variant}"),
        input_id: None,
        at: 0.0,
        request: serde_json::json!({"model": "m", "messages": [{"role": "user", "content": format!("question of {unit}")}]}),
        response: serde_json::json!({"text": text}),
        finish_reason: Some(if error.is_some() { "error" } else { "stop" }.into()),
        error: error.map(str::to_string),
        prompt_tokens: Some(12),
        output_tokens: Some(3),
        latency_ms: Some(40.5),
        review: None,
    }
}

async fn samples_read_back_by_every_filter_newest_first(f: &Fresh) {
    let s = f.store().await;
    let mut fan = sample("aa", "b", "u3", "Bonjour 50%_off", None);
    fan.input_id = Some("in-1".into());
    s.record_samples(&[
        sample("aa", "a", "u1", "Hello there", None),
        sample("aa", "b", "u2", "", Some("the engine stopped")),
        fan,
        sample("other", "a", "u1", "Hello elsewhere", None),
    ])
    .await
    .unwrap();
    let read = |q: SampleQuery| {
        let s = s.clone();
        async move {
            let got = s.samples("aa", &q).await.unwrap();
            got.iter().map(|x| x.unit.clone()).collect::<Vec<_>>()
        }
    };
    assert_eq!(read(SampleQuery::default()).await, ["u3", "u2", "u1"]);
    let q = |f: fn(&mut SampleQuery)| {
        let mut q = SampleQuery::default();
        f(&mut q);
        q
    };
    assert_eq!(
        read(q(|q| q.variant = Some("b".into()))).await,
        ["u3", "u2"]
    );
    assert_eq!(read(q(|q| q.error = Some(true))).await, ["u2"]);
    assert_eq!(read(q(|q| q.error = Some(false))).await, ["u3", "u1"]);
    assert_eq!(
        read(q(|q| q.finish_reason = Some("stop".into()))).await,
        ["u3", "u1"]
    );
    assert_eq!(read(q(|q| q.q = Some("HELLO".into()))).await, ["u1"]);
    assert_eq!(
        read(q(|q| q.q = Some("question of u2".into()))).await,
        ["u2"]
    );
    // LIKE's wildcards are searched as text
    assert_eq!(read(q(|q| q.q = Some("50%_".into()))).await, ["u3"]);
    assert_eq!(
        read(q(|q| q.q = Some("0%o".into()))).await,
        Vec::<String>::new()
    );
    assert_eq!(read(q(|q| q.input_id = Some("in-1".into()))).await, ["u3"]);
    assert_eq!(read(q(|q| q.unit = Some("u1".into()))).await, ["u1"]);
    assert_eq!(read(q(|q| q.limit = Some(2))).await, ["u3", "u2"]);
    let all = s.samples("aa", &SampleQuery::default()).await.unwrap();
    let mut next = SampleQuery::default();
    next.before = Some(all[1].id);
    assert_eq!(read(next).await, ["u1"]);
    let u1 = &all[2];
    assert_eq!(u1.request["messages"][0]["content"], "question of u1");
    assert_eq!(u1.response["text"], "Hello there");
    assert_eq!(
        (u1.prompt_tokens, u1.output_tokens, u1.latency_ms),
        (Some(12), Some(3), Some(40.5))
    );
    assert_eq!(u1.request_id, "chatcmpl-u1-a");
    assert!(u1.at > 1.7e9);
}

async fn old_samples_are_deleted_and_a_unit_is_erased_everywhere_or_in_one_experiment(f: &Fresh) {
    let s = f.store().await;
    s.record_samples(&[
        sample("aa", "a", "u1", "x", None),
        sample("aa", "a", "u2", "y", None),
    ])
    .await
    .unwrap();
    // an eval run over them holds their text: it goes with them
    let req = serde_json::json!({});
    s.start_eval_run("aa", "rita", &req, 2).await.unwrap();
    let now = now();
    assert_eq!(s.delete_samples_before("aa", now - 60.0).await.unwrap(), 0);
    assert_eq!(s.eval_runs("aa", 10).await.unwrap().len(), 1);
    assert_eq!(
        s.delete_samples_before("other", now + 60.0).await.unwrap(),
        0
    );
    assert_eq!(s.delete_samples_before("aa", now + 60.0).await.unwrap(), 2);
    assert!(s.eval_runs("aa", 10).await.unwrap().is_empty());

    for e in ["aa", "bb"] {
        s.record_samples(&[
            sample(e, "a", "u1", "x", None),
            sample(e, "a", "u2", "y", None),
        ])
        .await
        .unwrap();
        s.record_exposure(e, &exposure("a", "u1", 1.0))
            .await
            .unwrap();
        s.record_exposure(e, &exposure("a", "u2", 1.0))
            .await
            .unwrap();
        s.record_events(
            e,
            None,
            &[
                event("u1", "m", 1.0),
                event("u1", "m", 2.0),
                event("u2", "m", 1.0),
            ],
        )
        .await
        .unwrap();
    }
    for e in ["aa", "bb", "cc"] {
        s.start_eval_run(e, "rita", &req, 2).await.unwrap();
    }
    let one = s.erase_unit("u1", Some("aa")).await.unwrap();
    assert_eq!(
        (one.samples, one.exposures, one.events, one.eval_runs),
        (1, 1, 2, 1)
    );
    let rest = s.erase_unit("u1", None).await.unwrap();
    assert_eq!(
        (rest.samples, rest.exposures, rest.events, rest.eval_runs),
        (1, 1, 2, 1)
    );
    assert_eq!(
        s.eval_runs("cc", 10).await.unwrap().len(),
        1,
        "u1 had no sample in cc"
    );
    assert_eq!(
        s.erase_unit("u1", None).await.unwrap(),
        crate::Erased::default()
    );
    // u2 untouched
    for e in ["aa", "bb"] {
        assert_eq!(
            s.samples(e, &SampleQuery::default()).await.unwrap().len(),
            1
        );
        assert_eq!(s.units(e).await.unwrap().values().sum::<u64>(), 1);
    }
}

async fn audit_entries_read_back_newest_first(f: &Fresh) {
    let s = f.store().await;
    for (who, status) in [("ops", 201), ("api-key", 409)] {
        let e = AuditEntry {
            at: 0.0,
            who: who.into(),
            role: "admin".into(),
            method: "POST".into(),
            path: "/v1/experiments".into(),
            status,
        };
        s.record_audit(&e).await.unwrap();
    }
    let log = s.audit(10).await.unwrap();
    let got: Vec<(&str, u16)> = log.iter().map(|e| (e.who.as_str(), e.status)).collect();
    assert_eq!(got, [("api-key", 409), ("ops", 201)]);
    assert!(log[0].at >= log[1].at && log[1].at > 1.7e9);
    assert_eq!(s.audit(1).await.unwrap().len(), 1);
}

async fn units_served_to_a_key_are_those_its_exposures_name(f: &Fresh) {
    let s = f.store().await;
    let mut x = exposure("a", "u1", 1.0);
    x.caller = Some("app".into());
    s.record_exposure("aa", &x).await.unwrap();
    x.unit = "u2".into();
    x.caller = Some("nightly".into());
    s.record_exposure("aa", &x).await.unwrap();
    x.unit = "u3".into();
    x.caller = None;
    s.record_exposure("aa", &x).await.unwrap();
    x.unit = "u4".into();
    x.caller = Some("app".into());
    s.record_exposure("bb", &x).await.unwrap();
    // more units than one statement asks about (500), u1 among them
    let many: Vec<String> = (0..1200).map(|i| format!("v{i}")).collect();
    let mut asked: BTreeSet<&str> = many.iter().map(String::as_str).collect();
    asked.extend(["u1", "u2", "u3", "u4"]);
    let served = s.units_served_to("aa", "app", &asked).await.unwrap();
    assert_eq!(served, BTreeSet::from(["u1".to_string()]));
    let served = s.units_served_to("aa", "nightly", &asked).await.unwrap();
    assert_eq!(served, BTreeSet::from(["u2".to_string()]));
    assert!(s
        .units_served_to("bb", "nightly", &asked)
        .await
        .unwrap()
        .is_empty());
    let back = s.recent_exposures("aa", 10).await.unwrap();
    let callers: Vec<Option<&str>> = back.iter().map(|r| r.exposure.caller.as_deref()).collect();
    assert_eq!(callers, [None, Some("nightly"), Some("app")]);
}

async fn a_dataset_reads_every_page_newest_first_up_to_its_limit(f: &Fresh) {
    let s = f.store().await;
    let all: Vec<Sample> = (0..1203)
        .map(|i| sample("aa", "a", &format!("u{i}"), "hi", None))
        .collect();
    s.record_samples(&all).await.unwrap();
    let (text, n) = s.dataset("aa", &SampleQuery::default()).await.unwrap();
    let units: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["unit"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(n, 1203);
    assert_eq!(units.len(), 1203);
    assert_eq!((units[0].as_str(), units[1202].as_str()), ("u1202", "u0"));
    let capped = SampleQuery {
        limit: Some(700),
        ..Default::default()
    };
    let (text, n) = s.dataset("aa", &capped).await.unwrap();
    assert_eq!((n, text.lines().count()), (700, 700));
    assert!(text.lines().last().unwrap().contains("\"u503\""));
}

async fn an_eval_run_is_running_until_finished_with_its_summary_and_report(f: &Fresh) {
    let s = f.store().await;
    let req = serde_json::json!({"filter": {"q": "x"}, "judge": "smol"});
    let a = s.start_eval_run("aa", "rita", &req, 3).await.unwrap();
    let b = s.start_eval_run("aa", "ops", &req, 1).await.unwrap();
    assert!(b > a);
    let run = s.eval_run("aa", a).await.unwrap().unwrap();
    assert_eq!(
        (run.status.as_str(), run.rows, run.who.as_str()),
        ("running", 3, "rita")
    );
    assert_eq!(run.request, req);
    assert!(run.summary.is_none() && s.eval_report("aa", a).await.unwrap().is_none());
    let summary = serde_json::json!({"rows": 3});
    s.finish_eval_run(a, Ok((&summary, "<html>r</html>")))
        .await
        .unwrap();
    s.finish_eval_run(b, Err("the judge is gone"))
        .await
        .unwrap();
    let runs = s.eval_runs("aa", 10).await.unwrap();
    let got: Vec<(i64, &str, Option<&str>)> = runs
        .iter()
        .map(|r| (r.id, r.status.as_str(), r.error.as_deref()))
        .collect();
    assert_eq!(
        got,
        [(b, "failed", Some("the judge is gone")), (a, "done", None)]
    );
    assert_eq!(runs[1].summary, Some(summary));
    assert!(runs[1].finished.unwrap() >= runs[1].at);
    assert_eq!(
        s.eval_report("aa", a).await.unwrap().as_deref(),
        Some("<html>r</html>")
    );
    assert!(
        s.eval_run("bb", a).await.unwrap().is_none(),
        "runs belong to their experiment"
    );
    assert_eq!(s.eval_runs("aa", 1).await.unwrap().len(), 1);
    // a run whose process stopped beating reads as interrupted; a beating one as running
    let c = s.start_eval_run("aa", "rita", &req, 1).await.unwrap();
    let stale = now() - crate::store::evals::STALE - 1.0;
    s.beat_eval_run(c, stale).await.unwrap();
    assert_eq!(
        s.eval_run("aa", c).await.unwrap().unwrap().status,
        "interrupted"
    );
    s.beat_eval_run(c, now()).await.unwrap();
    assert_eq!(
        s.eval_run("aa", c).await.unwrap().unwrap().status,
        "running"
    );
    s.beat_eval_run(a, stale).await.unwrap();
    assert_eq!(
        s.eval_run("aa", a).await.unwrap().unwrap().status,
        "done",
        "a finished run keeps its status"
    );
}

async fn reviews_of_different_fields_at_the_same_moment_keep_every_field(f: &Fresh) {
    let s = f.store().await;
    s.record_samples(&[sample("aa", "a", "u1", "x", None)])
        .await
        .unwrap();
    let id = s.samples("aa", &SampleQuery::default()).await.unwrap()[0].id;
    // 24 reviewers at once, each setting a field of its own (and `by`, which the last one wins)
    let writes: Vec<_> = (0..24)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let patch = serde_json::json!({ format!("f{i}"): i, "by": format!("r{i}") });
                s.review_sample("aa", id, &patch).await.unwrap().unwrap()
            })
        })
        .collect();
    for w in writes {
        w.await.unwrap();
    }
    let review = s.sample("aa", id).await.unwrap().unwrap().review.unwrap();
    for i in 0..24 {
        assert_eq!(review[format!("f{i}")], i, "{review}");
    }
    assert!(review["by"].as_str().unwrap().starts_with('r'));
    let changed = s
        .review_sample("aa", id, &serde_json::json!({"f3": "again"}))
        .await
        .unwrap()
        .unwrap()
        .review
        .unwrap();
    assert_eq!(
        (changed["f3"].as_str(), changed["f4"].as_i64()),
        (Some("again"), Some(4))
    );
    assert!(s
        .review_sample("aa", id + 1, &serde_json::json!({"f": 1}))
        .await
        .unwrap()
        .is_none());
    assert!(s
        .review_sample("bb", id, &serde_json::json!({"f": 1}))
        .await
        .unwrap()
        .is_none());
}
