//! Scale-out on the real PostgreSQL (made reachable by `scripts/services.sh`; a missing
//! service fails this test): two `abserve serve` replicas on one store share experiments,
//! exposures, events and results. The job queue's workers: `queue_workers.rs`.

mod support;

use std::time::{Duration, Instant};

use abserve_ab::testing::Fresh;
use serde_json::{json, Value};
use support::{client, status, Server};

// ---------------------------------------------------------------------------------------------
// Two replicas, one PostgreSQL

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_on_one_postgres_share_experiments_exposures_events_and_results() {
    let db = Fresh::postgres("replicas").await;
    let url = db.url();
    // a long poll: the change must reach B through PostgreSQL's NOTIFY
    let flags: &[&str] = &["--store", &url, "--store-poll", "60", "--threads", "1"];
    let mut servers = Server::start_replicas(&[flags, flags]);
    let (b, a) = (servers.pop().unwrap(), servers.pop().unwrap());
    let c = client();
    let def = json!({"name": "shared", "variants": [
        {"id": "a", "system": "Answer in one word.", "temperature": 0.0, "max_tokens": 1},
        {"id": "b", "system": "Answer in one word.", "temperature": 0.0, "max_tokens": 1}]});
    assert_eq!(
        status(c.post(a.url("/v1/experiments")).json(&def)).await,
        201
    );
    // created on A, routed on B within 10 s
    let deadline = Instant::now() + Duration::from_secs(10);
    while c
        .get(b.url("/v1/experiments/shared"))
        .send()
        .await
        .unwrap()
        .status()
        != 200
    {
        assert!(
            Instant::now() < deadline,
            "B does not know the experiment after 10 s: {}",
            b.log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // exposures through both replicas, 20 units each
    let mut units = vec![];
    for (i, s) in [&a, &b].iter().enumerate() {
        for j in 0..20 {
            let unit = format!("user-{i}-{j}");
            let r = c
                .post(s.url("/v1/chat/completions"))
                .json(&json!({"model": "experiment:shared", "user": unit, "messages": [{"role": "user", "content": "Capital of France?"}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
            units.push(unit);
        }
    }
    // events through A, one batch; the same batch retried through B is stored once
    let events: Vec<Value> = units
        .iter()
        .enumerate()
        .map(|(k, u)| json!({"unit": u, "metric": "score", "value": (k % 5) as f64}))
        .collect();
    let batch = json!({"batch_id": "replicas-1", "events": events});
    let first: Value = c
        .post(a.url("/v1/experiments/shared/events"))
        .json(&batch)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(first["stored"], 40, "{first}");
    let retry: Value = c
        .post(b.url("/v1/experiments/shared/events"))
        .json(&batch)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (retry["stored"].clone(), retry["duplicate_batch"].clone()),
        (json!(0), json!(true)),
        "{retry}"
    );
    // results on B count every replica's exposures and events, and equal A's
    let ra: Value = c
        .get(a.url("/v1/experiments/shared/results"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rb: Value = c
        .get(b.url("/v1/experiments/shared/results"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let total = |r: &Value, k: &str| {
        r["variants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v[k].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(total(&rb, "units"), 40, "{rb}");
    assert_eq!(total(&rb, "exposures"), 40, "{rb}");
    let n = |r: &Value| {
        r["variants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["metrics"]["score"]["summary"]["n"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(n(&rb), 40, "every unit's events count: {rb}");
    assert_eq!(ra, rb, "both replicas give the same results");
    // a delete on B stops routing on A
    assert_eq!(status(c.delete(b.url("/v1/experiments/shared"))).await, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while c
        .get(a.url("/v1/experiments/shared"))
        .send()
        .await
        .unwrap()
        .status()
        != 404
    {
        assert!(
            Instant::now() < deadline,
            "A still routes a deleted experiment after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop((a, b));
    db.drop().await;
}
