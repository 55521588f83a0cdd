//! A full disk under a real `abserve serve` (a tmpfs of 8 MiB; CI runs as root): writes are
//! refused with 507 and nothing half-written, inference keeps serving, the first write after
//! space returns succeeds (a SQLite connection left inside a transaction by SQLITE_FULL is
//! closed, not reused: `abserve_ab`'s store), and everything acknowledged survives a restart.

mod support;

use std::io::Write;

use serde_json::{json, Value};
use support::{client, metric, status, Server, MODEL_ID};

fn experiment(name: &str, variants: Value) -> Value {
    json!({"name": name, "variants": variants})
}

/// A tmpfs of `size` mounted for the test (CI runs as root), unmounted when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = std::env::temp_dir().join(format!("abserve-tmpfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status();
        assert!(
            st.as_ref().is_ok_and(|s| s.success()),
            "mounting a tmpfs needs root (CI runs as root): {st:?}"
        );
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes zeros to `path` until the file system is full.
fn fill(path: &std::path::Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while f.write_all(&chunk).is_ok() {}
    let small = [0u8; 512];
    while f.write_all(&small).is_ok() {}
    let _ = f.sync_all();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_refuses_writes_with_507_loses_nothing_acknowledged_and_inference_keeps_serving(
) {
    let fs = Tmpfs::mount("8m");
    let data = fs.0.join("data").display().to_string();
    let c = client();
    let batch = |id: &str, n: usize| {
        let events: Vec<Value> = (0..n)
            .map(|i| json!({"unit": format!("u{i}"), "metric": "score", "value": i as f64}))
            .collect();
        json!({"batch_id": id, "events": events})
    };
    let post_events = |s: &Server, body: Value| {
        let r = c
            .post(s.url("/v1/experiments/full/events"))
            .json(&body)
            .send();
        async move {
            let r = r.await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let s = Server::start(&["--data-dir", &data]);
    assert_eq!(
        status(
            c.post(s.url("/v1/experiments"))
                .json(&experiment("full", json!([{"id": "a"}, {"id": "b"}])))
        )
        .await,
        201
    );
    assert_eq!(post_events(&s, batch("b1", 100)).await.0, 200);
    let filler = fs.0.join("filler");
    fill(&filler);
    // the disk is full: writes are refused with the reason, nothing half-written
    let (code, body) = post_events(&s, batch("b2", 10_000)).await;
    assert_eq!(code, 507, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("full"),
        "{body}"
    );
    let (code, _) = post_events(&s, batch("b3", 10_000)).await;
    assert_eq!(code, 507);
    // a small write may still fit in file space SQLite's WAL already holds (the refused batches'
    // frames are reused): then it is acknowledged and must last; otherwise it is refused
    let more = c
        .post(s.url("/v1/experiments"))
        .json(&experiment("more", json!([{"id": "a"}, {"id": "b"}])))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert!(matches!(more, 201 | 507), "{more}");
    // inference keeps serving, on the plain model and through the experiment
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "user": "u1"});
    assert_eq!(
        status(c.post(s.url("/v1/chat/completions")).json(&chat(MODEL_ID))).await,
        200
    );
    let r = c
        .post(s.url("/v1/chat/completions"))
        .json(&chat("experiment:full"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // the answer says whether its exposure was stored
    let exposed = r.json::<Value>().await.unwrap()["abserve"]["in_experiment"]
        .as_bool()
        .unwrap();
    assert_eq!(
        status(c.get(s.url("/v1/experiments/full/results"))).await,
        200,
        "reads still work"
    );
    let m = s.metrics().await;
    assert!(metric(&m, "abserve_store_errors_total{operation=\"events\"}").unwrap() >= 2.0);
    if !exposed {
        assert!(metric(&m, "abserve_store_errors_total{operation=\"exposure\"}").unwrap() >= 1.0);
    }
    // space returns: writes succeed again
    std::fs::remove_file(&filler).unwrap();
    let (status, body) = post_events(&s, batch("b2", 10_000)).await;
    assert_eq!(
        (status, body["stored"].as_u64()),
        (200, Some(10_000)),
        "{body}"
    );
    drop(s);
    // every acknowledged batch survived a restart (a repeat is recognised, nothing counted twice)
    let s = Server::start(&["--data-dir", &data]);
    for id in ["b1", "b2"] {
        let n = if id == "b1" { 100 } else { 10_000 };
        let (status, body) = post_events(&s, batch(id, n)).await;
        assert_eq!(
            (status, body["duplicate_batch"].as_bool()),
            (200, Some(true)),
            "{id}: {body}"
        );
    }
    let (status, body) = post_events(&s, batch("b3", 10)).await;
    assert_eq!(
        (status, body["stored"].as_u64()),
        (200, Some(10)),
        "b3 was refused, never stored: {body}"
    );
    // what was acknowledged during the full disk is there, what was refused is not
    let got = c
        .get(s.url("/v1/experiments/more"))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(
        got,
        if more == 201 { 200 } else { 404 },
        "experiment 'more' answered {more} when the disk was full"
    );
    let results: Value = c
        .get(s.url("/v1/experiments/full/results"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let units: u64 = results["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["units"].as_u64().unwrap())
        .sum();
    assert_eq!(
        units, exposed as u64,
        "the exposure counts exactly when its answer said so: {results}"
    );
}
