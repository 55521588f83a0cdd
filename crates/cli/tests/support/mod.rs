//! Starts a real `abserve serve` on 127.0.0.1 with a port the OS picks, and stops it when the
//! test ends.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub fn model() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "default model missing: run scripts/setup.sh");
    p
}

pub struct Server {
    pub child: Option<Child>,
    pub base: String,
    pub data_dir: String,
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
    turn: Option<Turn>,
}

/// One running server per test binary at a time. Each server runs llama.cpp with worker threads
/// that spin while they wait; several servers on a 2-core CI machine starve each other so badly
/// that a drain of 8 short streams took over a minute. Tests queue here instead.
static GATE: (std::sync::Mutex<bool>, std::sync::Condvar) =
    (std::sync::Mutex::new(false), std::sync::Condvar::new());

struct Turn;

/// Holds the same turn as a running server, for tests that load the model in another process
/// (`abserve eval` in-process). Drop it before starting a server in the same test.
pub struct Exclusive(#[allow(dead_code)] Turn);

pub fn exclusive() -> Exclusive {
    Exclusive(Turn::take())
}

impl Turn {
    fn take() -> Turn {
        let mut busy = GATE.0.lock().unwrap_or_else(|e| e.into_inner());
        while *busy {
            busy = GATE.1.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        *busy = true;
        Turn
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        *GATE.0.lock().unwrap_or_else(|e| e.into_inner()) = false;
        GATE.1.notify_one();
    }
}

pub const MODEL_ID: &str = "smol";

static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// SIGKILL: no chance to flush or clean up.
pub fn kill9(s: &mut Server) {
    if let Some(mut c) = s.child.take() {
        // SAFETY: kill(2) with the pid of a child this test spawned and has not reaped yet.
        unsafe {
            libc_kill(c.id() as i32, 9);
        }
        let _ = c.wait();
    }
    s.turn = None;
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::spawn(
            env!("CARGO_BIN_EXE_abserve"),
            extra,
            &[],
            Some(Turn::take()),
        )
    }

    /// A server with these environment variables set (a test's fault injection).
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        Server::spawn(
            env!("CARGO_BIN_EXE_abserve"),
            extra,
            env,
            Some(Turn::take()),
        )
    }

    /// A server of another build of abserve (the Vulkan build's tests).
    pub fn start_bin(bin: &str, extra: &[&str]) -> Server {
        Server::spawn(bin, extra, &[], Some(Turn::take()))
    }

    /// Several servers running at once (replicas of one store), sharing one turn.
    pub fn start_replicas(extras: &[&[&str]]) -> Vec<Server> {
        let mut turn = Some(Turn::take());
        extras
            .iter()
            .map(|extra| Server::spawn(env!("CARGO_BIN_EXE_abserve"), extra, &[], turn.take()))
            .collect()
    }

    fn spawn(bin: &str, extra: &[&str], env: &[(&str, &str)], turn: Option<Turn>) -> Server {
        let defaults = [
            ("--model", model().display().to_string()),
            ("--model-id", MODEL_ID.to_string()),
            ("--port", "0".to_string()),
            ("--threads", "2".to_string()),
            ("--memory-budget", "1GiB".to_string()),
            ("--context", "512".to_string()),
            ("--kv-cells", "4096".to_string()),
        ];
        let mut args = vec!["serve".to_string()];
        for (flag, value) in defaults {
            if !extra.contains(&flag) {
                args.push(flag.to_string());
                args.push(value);
            }
        }
        let data_dir = match extra.iter().position(|a| *a == "--data-dir") {
            Some(i) => extra[i + 1].to_string(),
            None => {
                let dir = std::env::temp_dir().join(format!(
                    "abserve-test-{}-{}",
                    std::process::id(),
                    NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                ));
                let _ = std::fs::remove_dir_all(&dir);
                args.push("--data-dir".into());
                args.push(dir.display().to_string());
                dir.display().to_string()
            }
        };
        // a flag followed by "-" drops that default instead of setting it
        let mut i = 0;
        while i < extra.len() {
            if extra.get(i + 1) == Some(&"-") {
                i += 2;
                continue;
            }
            args.push(extra[i].to_string());
            i += 1;
        }
        let mut child = Command::new(bin)
            .args(&args)
            .env("ABSERVE_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start abserve serve");
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        {
            let stderr = child.stderr.take().unwrap();
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    log.lock().unwrap().push_str(&(line + "\n"));
                }
            });
        }
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("abserve: listening on ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let base = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(b) => b,
            Err(_) => {
                let _ = child.kill();
                panic!("server did not start: {}", log.lock().unwrap());
            }
        };
        assert!(
            base.starts_with("http://127.0.0.1:"),
            "binds loopback: {base}"
        );
        Server {
            child: Some(child),
            base,
            data_dir,
            log,
            turn,
        }
    }

    /// The first line of the server's log that contains `needle`, waiting up to `within` for it.
    /// stderr is read by its own thread, so a line the server wrote before it printed its address
    /// (or before it exited) can reach `log` after the test has moved on; `Err` holds the log.
    pub fn log_line(&self, needle: &str, within: Duration) -> Result<String, String> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let log = self.log.lock().unwrap().clone();
            if let Some(line) = log.lines().find(|l| l.contains(needle)) {
                return Ok(line.to_string());
            }
            if std::time::Instant::now() >= deadline {
                return Err(log);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// The text of `/metrics` now.
    pub async fn metrics(&self) -> String {
        let r = client().get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(r.status(), 200, "/metrics");
        r.text().await.unwrap()
    }

    /// Sends SIGTERM and waits for the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) with the pid of a child this test spawned and has not reaped yet.
        unsafe {
            libc_kill(child.id() as i32, 15);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.turn = None;
                return status.code();
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("server did not exit after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The tests' HTTP client: generous timeout (a request may wait behind others on 2 cores).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

/// Sends a request and returns its status (the tests' `assert_eq!(status(c.get(url)).await, 200)`).
pub async fn status(request: reqwest::RequestBuilder) -> reqwest::StatusCode {
    request.send().await.unwrap().status()
}

/// Value of a Prometheus series `name{labels}` (labels as written, or the bare name), read with
/// the same parser loadtest uses.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    abserve_protocol::parse_prometheus(text).get(series)
}

/// `promtool check metrics` on a `/metrics` text: fails the test with promtool's complaints.
pub fn promtool_check(text: &str) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus) must be installed: scripts/setup.sh does it");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The repository's root (scripts, examples, models).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh, empty temporary directory of this test process.
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("abserve-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every line of a JSONL file as JSON (none when the file does not exist yet).
pub fn jsonl(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

/// POSTs a JSON body: the status and the JSON answer (`Null` when it is not JSON).
pub async fn post_json(
    c: &reqwest::Client,
    url: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = c.post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

/// The `data:` payloads of a server-sent-events response, read with the protocol crate's decoder
/// (the last one `[DONE]` when the stream ended properly).
pub async fn sse(r: reqwest::Response) -> Vec<String> {
    use abserve_protocol::{SseDecoder, SseEvent};
    use futures::StreamExt;
    let mut decoder = SseDecoder::new();
    let mut out = vec![];
    let mut body = r.bytes_stream();
    let text = |e: SseEvent| match e {
        SseEvent::Data(d) => d,
        SseEvent::Done => "[DONE]".to_string(),
    };
    while let Some(chunk) = body.next().await {
        out.extend(decoder.feed(&chunk.unwrap()).into_iter().map(text));
    }
    out.extend(decoder.finish().map(text));
    out
}

/// The RabbitMQ the queue tests use (`scripts/services.sh` makes it reachable).
pub fn amqp_url() -> String {
    std::env::var("ABSERVE_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Deletes a job queue's queues and dead-letter exchange (a test's, when it is done).
pub async fn delete_queues(ch: &abserve_queue::lapin::Channel, queue: &str) {
    use abserve_queue::lapin::options::QueueDeleteOptions;
    for q in [queue.to_string(), format!("{queue}.dead")] {
        let _ = ch.queue_delete(&q, QueueDeleteOptions::default()).await;
    }
    let _ = ch
        .exchange_delete(&format!("{queue}.dlx"), Default::default())
        .await;
}

/// A child process of a test (a worker, an eval), killed and reaped when the test ends, also when
/// it fails halfway.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
