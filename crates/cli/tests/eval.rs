//! `abserve eval` end to end on the default model: in-process and against a real `abserve
//! serve`, resume after SIGKILL, bad input rejected before any model work, and the HTML report
//! rendered by headless Chromium.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{exclusive, jsonl, model, root, tmp, Server};

fn model_flags() -> Vec<String> {
    [
        "--model",
        &model().display().to_string(),
        "--memory-budget",
        "1GiB",
        "--context",
        "768",
        "--threads",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn eval(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_abserve"))
        .arg("eval")
        .args(args)
        .output()
        .unwrap()
}

/// The first `n` rows of the example dataset.
fn example_rows(dir: &Path, n: usize) -> PathBuf {
    let text = std::fs::read_to_string(root().join("examples/support-questions.jsonl")).unwrap();
    let p = dir.join("rows.jsonl");
    std::fs::write(
        &p,
        text.lines()
            .take(n)
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
    )
    .unwrap();
    p
}

const MINI: &str = r#"
[[experiment]]
name = "mini"
[[experiment.variants]]
id = "a"
system = "Answer briefly."
temperature = 0.0
max_tokens = 16
[[experiment.variants]]
id = "b"
template = "Question: {{ input }}"
temperature = 0.7
max_tokens = 16
[[scorer]]
type = "contains"
"#;

/// Every row × variant answered once, with scores, and the report files written.
fn assert_complete(out: &Path, rows: usize, variants: &[&str]) -> Value {
    let rs = jsonl(&out.join("results.jsonl"));
    let mut seen = BTreeMap::new();
    for r in &rs {
        assert!(r["error"].is_null(), "row failed: {r}");
        assert!(
            r["output"].is_string() && r["completion_tokens"].as_u64().unwrap() > 0,
            "{r}"
        );
        assert!(r["ttft_ms"].as_f64().unwrap() <= r["latency_ms"].as_f64().unwrap());
        *seen
            .entry((
                r["row"].as_str().unwrap().to_string(),
                r["variant"].as_str().unwrap().to_string(),
            ))
            .or_insert(0) += 1;
    }
    assert_eq!(
        seen.len(),
        rows * variants.len(),
        "every input × variant: {seen:?}"
    );
    assert!(seen.values().all(|n| *n == 1), "no answer twice: {seen:?}");
    let got: BTreeSet<&str> = seen.keys().map(|(_, v)| v.as_str()).collect();
    assert_eq!(got, variants.iter().copied().collect());
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["rows"], rows);
    for f in ["report.md", "report.html"] {
        assert!(
            std::fs::metadata(out.join(f)).unwrap().len() > 500,
            "{f} written"
        );
    }
    summary
}

/// Rows of the example's questions the end-to-end test asks; 3 give every property it checks (the
/// judge on each row, comparisons per scorer, the report's rows) at half the model time of 6.
const ROWS: usize = 3;
/// The judge compares each of the 3 other variants with control on every row.
const JUDGED: usize = 3 * ROWS;

#[test]
fn example_experiment_in_process_and_against_a_server() {
    let dir = tmp("e2e");
    let data = example_rows(&dir, ROWS);
    let example = root()
        .join("examples/support-eval.toml")
        .display()
        .to_string();
    let variants = ["terse", "friendly", "friendly-sampled", "terse-topic"];

    let turn = exclusive();
    let out = dir.join("in-process");
    let mut args = vec![
        example.clone(),
        "--dataset".into(),
        data.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    args.extend(model_flags());
    let o = eval(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    drop(turn);
    let s = assert_complete(&out, ROWS, &variants);
    assert_eq!(s["concurrency_source"], "memory plan");
    assert!(s["peak_memory_bytes"].as_u64().unwrap() > 50_000_000);
    // the judge compared each of the 3 other variants with control on every row
    let judged = jsonl(&out.join("judgments.jsonl"));
    assert_eq!(judged.len(), JUDGED);
    assert!(
        judged.iter().all(|j| j["verdict"].is_string()),
        "{judged:?}"
    );
    // each pair asked in both orders; a verdict only where both agree
    for j in &judged {
        assert_eq!(j["variant_position"], "both");
        let (a, b) = (
            j["reply"].as_str().unwrap(),
            j["reply_swapped"].as_str().unwrap(),
        );
        let want = abserve_eval::both_orders(a, b);
        assert_eq!(j["verdict"], serde_json::to_value(want).unwrap(), "{j}");
    }
    let first = s["judge_chose_first"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&first));
    let agree = s["judge_agreement"].as_f64().unwrap();
    let consistent = judged
        .iter()
        .filter(|j| j["verdict"] != "inconsistent")
        .count();
    assert_eq!(agree, consistent as f64 / JUDGED as f64);
    // paired comparisons: 3 variants × 5 scorers
    assert_eq!(s["comparisons"].as_array().unwrap().len(), 15);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("terse (control)") && stdout.contains("states_fact"),
        "{stdout}"
    );
    check_report_in_chromium(&out.join("report.html"), ROWS, true);

    let server = Server::start(&[]);
    let out = dir.join("server");
    let o = eval(&[
        example,
        "--dataset".into(),
        data.display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--url".into(),
        server.url("/v1"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = assert_complete(&out, ROWS, &variants);
    assert!(
        s["concurrency_source"]
            .as_str()
            .unwrap()
            .ends_with("/ready"),
        "{}",
        s["concurrency_source"]
    );
    assert!(s["target"].as_str().unwrap().contains("model 'smol'"));
    assert_eq!(jsonl(&out.join("judgments.jsonl")).len(), JUDGED);
}

/// Opens the report in headless Chromium and checks the rendered page: its charts, every input
/// row, and the filter script having run.
fn check_report_in_chromium(report: &Path, rows: usize, judge: bool) {
    let profile = report.parent().unwrap().join("chromium-profile");
    let mut cmd = Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--dump-dom",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg(format!("file://{}", report.display()))
    .stderr(Stdio::null());
    let o = cmd
        .output()
        .expect("chromium is installed (scripts/setup.sh installs it)");
    assert!(o.status.success());
    let dom = String::from_utf8_lossy(&o.stdout);
    assert!(dom.contains("data-ready=\"1\""), "the report's script ran");
    assert!(dom.contains(&format!("{rows} of {rows} inputs shown")));
    assert_eq!(dom.matches("<tr class=\"row\"").count(), rows);
    assert!(dom.contains("id=\"latency-chart\""));
    assert!(dom.matches("class=\"latency-box\"").count() >= 2);
    assert!(dom.contains("id=\"score-chart-states_fact\""));
    assert!(dom.matches("class=\"score-bar\"").count() >= 2);
    assert_eq!(dom.contains("id=\"winrate-chart\""), judge);
    assert!(
        !dom.contains("http://") && !dom.contains("https://"),
        "self-contained: no network references"
    );
}

#[test]
fn a_run_killed_halfway_resumes_without_asking_anything_twice() {
    let dir = tmp("resume");
    let cfg = dir.join("mini.toml");
    std::fs::write(&cfg, MINI).unwrap();
    let data = example_rows(&dir, 12);
    let out = dir.join("out");
    let mut args = vec![
        cfg.display().to_string(),
        "--dataset".into(),
        data.display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--concurrency".into(),
        "2".into(),
    ];
    args.extend(model_flags());
    let _turn = exclusive();
    let mut child = Command::new(env!("CARGO_BIN_EXE_abserve"))
        .arg("eval")
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let results = out.join("results.jsonl");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let n = std::fs::read_to_string(&results)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if n >= 8 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before it could be killed"
        );
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before: Vec<String> = std::fs::read_to_string(&results)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert!(before.len() < 24, "killed halfway: {}", before.len());
    let complete = before
        .iter()
        .filter(|l| serde_json::from_str::<Value>(l).is_ok())
        .count();

    let o = eval(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains(&format!(
            "{} asked now, {complete} from an earlier run",
            24 - complete
        )),
        "{stdout}"
    );
    assert_complete(&out, 12, &["a", "b"]);
    // the answers finished before the kill are kept as they were
    let after = std::fs::read_to_string(&results).unwrap();
    for l in before
        .iter()
        .filter(|l| serde_json::from_str::<Value>(l).is_ok())
    {
        assert!(after.contains(l.as_str()));
    }
}

#[test]
fn bad_input_is_refused_before_any_model_work_and_bad_rows_are_skipped() {
    let dir = tmp("bad");
    let data = example_rows(&dir, 2);
    let run = |toml: &str, data: &Path, model: &str| {
        let cfg = dir.join("cfg.toml");
        std::fs::write(&cfg, toml).unwrap();
        eval(&[
            cfg.display().to_string(),
            "--dataset".into(),
            data.display().to_string(),
            "--out".into(),
            dir.join("out").display().to_string(),
            "--model".into(),
            model.into(),
        ])
    };
    let missing_model = "/nonexistent/model.gguf";
    // an unknown scorer: named, with the known ones; the (missing) model was never opened
    let o = run(
        &MINI.replace("type = \"contains\"", "type = \"bleu\""),
        &data,
        missing_model,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.contains("unknown scorer type 'bleu'")
            && err.contains("json_schema")
            && !err.contains("nonexistent"),
        "{err}"
    );
    // a template field no row has
    let o = run(
        &MINI.replace("Question: {{ input }}", "{{ topic }}: {{ input }}"),
        &data,
        missing_model,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        err.contains("variant 'b'")
            && err.contains("'topic', which no dataset row has")
            && err.contains("category, expected, id, input"),
        "{err}"
    );
    // a dataset with no usable rows
    let empty = dir.join("empty.jsonl");
    std::fs::write(&empty, "not json\n").unwrap();
    let o = run(MINI, &empty, missing_model);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no usable rows (line 1: not JSON"));

    // malformed rows: reported with their line numbers; the others run
    let mixed = dir.join("mixed.jsonl");
    let good = std::fs::read_to_string(&data).unwrap();
    let mut g = good.lines();
    std::fs::write(
        &mixed,
        format!(
            "{}\n{{\"input\": \n{}\n{{\"question\": \"x\"}}\n",
            g.next().unwrap(),
            g.next().unwrap()
        ),
    )
    .unwrap();
    let _turn = exclusive();
    let mut args = vec![
        dir.join("cfg.toml").display().to_string(),
        "--dataset".into(),
        mixed.display().to_string(),
        "--out".into(),
        dir.join("mixed-out").display().to_string(),
    ];
    std::fs::write(dir.join("cfg.toml"), MINI).unwrap();
    args.extend(model_flags());
    let o = eval(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("line 2: not JSON") && err.contains("line 4: has no 'input' field"),
        "{err}"
    );
    let s = assert_complete(&dir.join("mixed-out"), 2, &["a", "b"]);
    let skipped: Vec<u64> = s["skipped_rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["line"].as_u64().unwrap())
        .collect();
    assert_eq!(skipped, [2, 4]);
}

#[test]
fn answers_429_are_retried_until_every_row_is_done() {
    // one sequence at a time and no waiting room: most of 6 concurrent requests get 429
    let server = Server::start(&["--max-sequences", "1", "--max-queue", "0"]);
    let dir = tmp("retry");
    let cfg = dir.join("mini.toml");
    std::fs::write(&cfg, MINI).unwrap();
    let data = example_rows(&dir, 4);
    let out = dir.join("out");
    let o = eval(&[
        cfg.display().to_string(),
        "--dataset".into(),
        data.display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--url".into(),
        server.base.clone(),
        "--concurrency".into(),
        "6".into(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_complete(&out, 4, &["a", "b"]);
    let retried = jsonl(&out.join("results.jsonl"))
        .iter()
        .filter(|r| r["attempts"].as_u64().unwrap() > 1)
        .count();
    assert!(
        retried > 0,
        "some requests were turned away and asked again"
    );
    let m = tokio::runtime::Runtime::new().unwrap().block_on(async {
        reqwest::get(server.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    });
    assert!(
        support::metric(&m, "abserve_rejections_total{reason=\"queue_full\"}").unwrap_or(0.0) > 0.0,
        "{m}"
    );
}
