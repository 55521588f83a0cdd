//! `abserve eval --amqp` answered by `abserve worker`s on the real RabbitMQ (made reachable by
//! `scripts/services.sh`; a missing service fails these tests): one worker killed with SIGKILL
//! mid-run, a job that always fails, a job whose worker dies holding it every time, and
//! back-pressure.

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use abserve_protocol::names;
use abserve_queue::lapin::options::{BasicGetOptions, QueueDeclareOptions};
use abserve_queue::lapin::types::{AMQPValue, FieldTable};
use futures::StreamExt;
use serde_json::{json, Value};
use support::{amqp_url, client, delete_queues, exclusive, jsonl, model, tmp};

// ---------------------------------------------------------------------------------------------
// The job queue

const EXPERIMENT: &str = r#"
[[experiment]]
name = "queued"
[[experiment.variants]]
id = "a"
system = "Answer briefly."
temperature = 0.0
max_tokens = 6
[[experiment.variants]]
id = "b"
system = "Answer in one word."
temperature = 0.0
max_tokens = 6
[[experiment.variants]]
id = "c"
template = "Question: {{ input }}"
temperature = 0.0
max_tokens = 6

[[scorer]]
type = "length"
"#;

/// A queue name of its own for each test.
fn queue_name(test: &str) -> String {
    format!("abserve.test.{}.{test}", std::process::id())
}

struct Worker {
    child: Child,
    /// The plan's bytes, from the worker's first line.
    planned: std::sync::Arc<std::sync::Mutex<Option<u64>>>,
    /// With `--listen`: where its /health, /ready and /metrics are.
    ops: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

fn worker(queue: &str, extra: &[&str]) -> Worker {
    let mut child = Command::new(env!("CARGO_BIN_EXE_abserve"))
        .args([
            "worker",
            "--amqp",
            &amqp_url(),
            "--queue",
            queue,
            "--model",
            &model().display().to_string(),
        ])
        .args([
            "--memory-budget",
            "1GiB",
            "--context",
            "512",
            "--threads",
            "1",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let planned = std::sync::Arc::new(std::sync::Mutex::new(None));
    let ops = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (p, o, stderr) = (planned.clone(), ops.clone(), child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("planned ").nth(1) {
                *p.lock().unwrap() = rest.split(' ').next().and_then(|n| n.parse().ok());
            }
            if let Some(url) = line.strip_prefix("worker: /health, /ready and /metrics on ") {
                *o.lock().unwrap() = Some(url.to_string());
            }
            eprintln!("[worker] {line}");
        }
    });
    Worker {
        child,
        planned,
        ops,
    }
}

impl Worker {
    /// GET a path of its operations routes (`--listen`): status and body.
    async fn get(&self, path: &str) -> (u16, String) {
        let base = self
            .ops
            .lock()
            .unwrap()
            .clone()
            .expect("the worker printed its address");
        let r = client().get(format!("{base}{path}")).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dataset(dir: &Path, rows: usize, poison: bool) -> PathBuf {
    let mut text = String::new();
    for i in 0..rows {
        text.push_str(
            &json!({"id": format!("r{i}"), "input": format!("What is {i} plus {i}?")}).to_string(),
        );
        text.push('\n');
    }
    if poison {
        // longer than any variant's context: fails on every try
        let long = "word ".repeat(3000);
        text.push_str(&json!({"id": "too-long", "input": long}).to_string());
        text.push('\n');
    }
    let p = dir.join("rows.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

fn start_eval(dir: &Path, queue: &str, rows: &Path) -> Child {
    let exp = dir.join("exp.toml");
    std::fs::write(&exp, EXPERIMENT).unwrap();
    Command::new(env!("CARGO_BIN_EXE_abserve"))
        .args([
            "eval",
            exp.to_str().unwrap(),
            "--dataset",
            rows.to_str().unwrap(),
            "--out",
            dir.join("out").to_str().unwrap(),
        ])
        .args(["--amqp", &amqp_url(), "--queue", queue])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn results(dir: &Path) -> Vec<Value> {
    jsonl(&dir.join("out/results.jsonl"))
}

async fn wait_eval(child: Child, within: Duration) -> (i32, String) {
    let pid = child.id().to_string();
    let out = match tokio::time::timeout(
        within,
        tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()),
    )
    .await
    {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // or the test would hang on the eval still running when the runtime shuts down
            let _ = Command::new("kill").args(["-9", &pid]).status();
            panic!("the eval did not finish within {within:?}");
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// Ready and unacknowledged messages of a queue, as RabbitMQ counts them.
fn queue_counts(queue: &str) -> (u64, u64) {
    let out = Command::new("rabbitmqctl")
        .args([
            "-q",
            "list_queues",
            "name",
            "messages_ready",
            "messages_unacknowledged",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rabbitmqctl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 3 && f[0] == queue {
            return (f[1].parse().unwrap(), f[2].parse().unwrap());
        }
    }
    panic!("queue {queue} not listed by rabbitmqctl")
}

async fn channel() -> (
    abserve_queue::lapin::Connection,
    abserve_queue::lapin::Channel,
) {
    let conn = abserve_queue::lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .expect("RabbitMQ reachable (scripts/services.sh)");
    let ch = conn.create_channel().await.unwrap();
    (conn, ch)
}

async fn message_count(ch: &abserve_queue::lapin::Channel, queue: &str) -> u32 {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    ch.queue_declare(queue, passive, FieldTable::default())
        .await
        .unwrap()
        .message_count()
}

/// Waits (up to a minute) until `queue` holds at least `jobs` ready messages.
async fn wait_queued(conn: &abserve_queue::lapin::Connection, queue: &str, jobs: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // a passive declare of a queue not yet there closes its channel: one channel per try
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let probe = conn.create_channel().await.unwrap();
        if let Ok(q) = probe
            .queue_declare(queue, passive, FieldTable::default())
            .await
        {
            if q.message_count() >= jobs {
                return;
            }
        }
        assert!(Instant::now() < deadline, "jobs not published");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pairs(rs: &[Value]) -> Vec<(String, String)> {
    rs.iter()
        .map(|r| {
            (
                r["row"].as_str().unwrap().to_string(),
                r["variant"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn eval_over_amqp_survives_a_worker_killed_with_sigkill() {
    // 24 rows × 3 variants: the kill after 15 results comes with most of the jobs still to do
    const ROWS: usize = 24;
    const JOBS: usize = 3 * ROWS;
    let _turn = exclusive();
    let dir = tmp("kill9");
    let queue = queue_name("kill9");
    let (_conn, ch) = channel().await;
    let eval = start_eval(&dir, &queue, &dataset(&dir, ROWS, false));
    let mut first = worker(&queue, &[]);
    let _second = worker(&queue, &[]);
    // kill the first worker mid-run, with jobs in hand
    let deadline = Instant::now() + Duration::from_secs(300);
    while results(&dir).len() < 15 {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = results(&dir).len();
    first.child.kill().unwrap(); // SIGKILL
    first.child.wait().unwrap();
    assert!(
        before < JOBS,
        "the kill came mid-run ({before} of {JOBS} done)"
    );
    let (code, out) = wait_eval(eval, Duration::from_secs(600)).await;
    assert_eq!(code, 0, "{out}");
    let rs = results(&dir);
    let all = pairs(&rs);
    let unique: BTreeSet<_> = all.iter().cloned().collect();
    assert_eq!(
        all.len(),
        JOBS,
        "every row × variant exactly once in results.jsonl"
    );
    assert_eq!(unique.len(), JOBS);
    assert!(
        rs.iter()
            .all(|r| r["error"].is_null() && r["output"].is_string()),
        "all answered"
    );
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("out/summary.json")).unwrap())
            .unwrap();
    assert!(
        summary["variants"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["answered"] == ROWS),
        "{summary}"
    );
    assert!(dir.join("out/report.html").exists());
    assert_eq!(
        message_count(&ch, &queue).await,
        0,
        "no job left in the queue"
    );
    assert_eq!(
        message_count(&ch, &format!("{queue}.dead")).await,
        0,
        "dead-letter queue empty"
    );
    delete_queues(&ch, &queue).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_that_always_fails_is_dead_lettered_with_its_error_and_reported() {
    let _turn = exclusive();
    let dir = tmp("dead");
    let queue = queue_name("dead");
    let (_conn, ch) = channel().await;
    let eval = start_eval(&dir, &queue, &dataset(&dir, 3, true));
    let mut w = worker(&queue, &["--max-failures", "2", "--listen", "127.0.0.1:0"]);
    let (code, out) = wait_eval(eval, Duration::from_secs(300)).await;
    assert_eq!(code, 0, "the other rows were answered: {out}");
    // the worker's own /health, /ready (a real 1-token probe) and /metrics
    assert_eq!(w.get("/health").await.0, 200);
    let (status, ready) = w.get("/ready").await;
    assert_eq!(status, 200, "{ready}");
    let (status, text) = w.get("/metrics").await;
    assert_eq!(status, 200);
    support::promtool_check(&text);
    let m = abserve_protocol::parse_prometheus(&text);
    let jobs = |outcome: &str| {
        m.get(&format!("{}{{outcome=\"{outcome}\"}}", names::WORKER_JOBS))
            .unwrap_or_else(|| panic!("no {outcome} jobs in {text}"))
    };
    // 3 rows × 3 variants answered; the 3 poisoned jobs failed once (republished), then again
    // (dead-lettered, with an error result)
    assert_eq!(
        [
            jobs("answered"),
            jobs("retried"),
            jobs("dead_lettered"),
            jobs("returned")
        ],
        [9.0, 3.0, 3.0, 0.0],
        "{text}"
    );
    assert_eq!(m.get(names::WORKER_JOBS_IN_HAND), Some(0.0));
    assert!(
        m.get(names::WORKER_JOB_SECONDS).is_some_and(|s| s > 0.0),
        "{text}"
    );
    // and the engine's series, as `abserve serve` exports them
    assert_eq!(m.get(names::MEMORY_BUDGET), Some((1u64 << 30) as f64));
    assert!(
        m.get(names::GENERATED_TOKENS).is_some_and(|n| n > 0.0),
        "{text}"
    );
    // SIGTERM: nothing in hand, so it stops at once, and cleanly
    Command::new("kill")
        .args(["-TERM", &w.child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = w.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the worker did not stop within 30 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "worker exit: {status}");
    let rs = results(&dir);
    assert_eq!(rs.len(), 12);
    let failed: Vec<&Value> = rs.iter().filter(|r| r["row"] == "too-long").collect();
    assert_eq!(failed.len(), 3);
    for r in &failed {
        let e = r["error"].as_str().unwrap();
        assert!(
            e.contains("failed 2 times") && e.contains("maximum context length is 512 tokens"),
            "{e}"
        );
        assert_eq!(r["attempts"], 2);
    }
    assert!(
        out.contains("too-long") && out.contains("maximum context length is 512 tokens"),
        "the eval reports it: {out}"
    );
    // the three jobs wait in the dead-letter queue, each with its error
    let dead = format!("{queue}.dead");
    assert_eq!(message_count(&ch, &dead).await, 3);
    let m = ch
        .basic_get(&dead, BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("a dead letter");
    let headers = m.delivery.properties.headers().clone().unwrap();
    match headers.inner().get("x-abserve-error") {
        Some(AMQPValue::LongString(e)) => {
            assert!(
                e.to_string()
                    .contains("maximum context length is 512 tokens"),
                "{e}"
            )
        }
        other => panic!("no error header: {other:?}"),
    }
    assert_eq!(message_count(&ch, &queue).await, 0);
    delete_queues(&ch, &queue).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_whose_worker_dies_holding_it_every_time_is_reported_not_awaited_forever() {
    let _turn = exclusive();
    let dir = tmp("deathloop");
    let queue = queue_name("deathloop");
    let (conn, ch) = channel().await;
    // 1 row × 3 variants: 3 jobs
    let eval = start_eval(&dir, &queue, &dataset(&dir, 1, false));
    wait_queued(&conn, &queue, 3).await;
    // a worker that dies holding each job it takes: its connection drops before any ack
    // (a job given back by a closed connection is not counted as ready at once: wait for the
    // dead-letter queue, not for an empty jobs queue)
    let mut deliveries = 0;
    while message_count(&ch, &format!("{queue}.dead")).await < 3 {
        assert!(deliveries < 100, "the broker never dead-lettered the jobs");
        let (dying, dch) = channel().await;
        dch.basic_qos(1, Default::default()).await.unwrap();
        let mut consumer = dch
            .basic_consume(&queue, "dies", Default::default(), FieldTable::default())
            .await
            .unwrap();
        if let Ok(Some(d)) = tokio::time::timeout(Duration::from_secs(5), consumer.next()).await {
            d.unwrap();
            deliveries += 1;
        }
        dying.close(320, "the worker died").await.unwrap();
    }
    let (code, out) = wait_eval(eval, Duration::from_secs(60)).await;
    eprintln!("{deliveries} deliveries; eval exited {code}:\n{out}");
    let rs = results(&dir);
    assert_eq!(rs.len(), 3, "each job has its row: {rs:?}");
    for r in &rs {
        let e = r["error"].as_str().unwrap_or_else(|| panic!("{r}"));
        assert!(e.contains("dead-lettered by the broker"), "{e}");
        assert_eq!(r["attempts"], 10, "{r}");
    }
    assert!(
        out.contains("dead-lettered by the broker"),
        "the eval reports it: {out}"
    );
    // the jobs wait in the dead-letter queue for an operator, as the worker's dead letters do
    assert_eq!(message_count(&ch, &format!("{queue}.dead")).await, 3);
    delete_queues(&ch, &queue).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_of_4_slots_never_holds_more_than_4_jobs() {
    let _turn = exclusive();
    let dir = tmp("pressure");
    let queue = queue_name("pressure");
    let (conn, ch) = channel().await;
    // 90 jobs queued before any worker runs (30 rows × 3 variants): far more than 4 slots and
    // the 20 waiting the check below asks the queue to hold
    let eval = start_eval(&dir, &queue, &dataset(&dir, 30, false));
    wait_queued(&conn, &queue, 90).await;
    let w = worker(&queue, &["--max-sequences", "4"]);
    let pid = w.child.id();
    let (mut most_unacked, mut most_rss, mut samples, mut backlog_seen) = (0, 0u64, 0, false);
    let mut eval = Some(eval);
    while let Some(mut e) = eval.take() {
        if e.try_wait().unwrap().is_some() {
            let (code, out) = wait_eval(e, Duration::from_secs(10)).await;
            assert_eq!(code, 0, "{out}");
            break;
        }
        eval = Some(e);
        let (ready, unacked) = queue_counts(&queue);
        most_unacked = most_unacked.max(unacked);
        backlog_seen |= ready > 20 && unacked > 0;
        samples += 1;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if let Some(kb) = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
        {
            most_rss = most_rss.max(kb.parse::<u64>().unwrap() * 1024);
        }
    }
    let planned = w
        .planned
        .lock()
        .unwrap()
        .expect("the worker printed its plan");
    eprintln!("{samples} samples: at most {most_unacked} unacked; peak RSS {most_rss} of planned {planned}");
    assert!(samples >= 3, "sampled during the run");
    assert!(backlog_seen, "the queue, not the worker, held the backlog");
    assert!(
        most_unacked <= 4,
        "the worker held {most_unacked} unacked deliveries with 4 slots"
    );
    assert!(
        most_rss as f64 <= planned as f64 * 1.1,
        "RSS {most_rss} above plan {planned} + 10%"
    );
    assert_eq!(results(&dir).len(), 90);
    delete_queues(&ch, &queue).await;
}
