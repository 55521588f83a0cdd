//! The `abserve` binary as a user runs it: `plan` on the default model and on the problem
//! statement's hypothetical, `generate`, and bad input that must end in one clear error line
//! with exit code 2.

mod support;

use std::process::{Command, Output};

use abserve_engine::gguf::{GgufHeader, ModelShape};
use support::model;

fn abserve(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_abserve"))
        .args(args)
        .output()
        .expect("run abserve")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("plan --json prints one JSON object")
}

/// Exit code 2, a single `error:` line, no panic.
fn assert_clean_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {err}");
    assert!(
        lines[0].to_lowercase().contains(&needle.to_lowercase()),
        "'{needle}' not in: {}",
        lines[0]
    );
}

#[test]
fn plan_json_matches_the_kv_formula_for_the_default_model() {
    let m = model();
    let v = json(&abserve(&[
        "plan",
        "--json",
        "--model",
        m.to_str().unwrap(),
    ]));
    let h = GgufHeader::read(&m).unwrap();
    let s = ModelShape::from_header(&h).unwrap();
    let formula = 2 * s.n_layer * s.n_head_kv * (s.n_embd / s.n_head) * 2;
    assert_eq!(formula, 23040); // 2 × 30 layers × 3 KV heads × 64 × 2 bytes (f16)
    assert_eq!(v["kv_bytes_per_token"].as_u64().unwrap(), formula);
    assert_eq!(v["weights_bytes"].as_u64().unwrap(), h.weights_bytes());
    for key in [
        "weights_bytes",
        "kv_bytes_per_token",
        "kv_cells",
        "full_context_sequences",
        "budget_bytes",
        "fits",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["fits"], true);
    let q8 = json(&abserve(&[
        "plan",
        "--json",
        "--model",
        m.to_str().unwrap(),
        "--kv-type",
        "q8_0",
    ]));
    assert_eq!(
        q8["kv_bytes_per_token"].as_u64().unwrap(),
        2 * 30 * 3 * 64 / 32 * 34
    );
}

#[test]
fn problem_statement_hypothetical_one_copy_fits_two_do_not() {
    let args = [
        "plan",
        "--json",
        "--weights-bytes",
        "82208358400",
        "--layers",
        "80",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--device-memory",
        "96GiB",
        "--context",
        "4096",
    ];
    let v = json(&abserve(&args));
    assert_eq!(v["fits"], true);
    assert_eq!(v["copies_that_fit"].as_u64().unwrap(), 1);
    // the plan splits: every layer and the weights on the 96 GiB device, the rest on the host
    let (device, host) = (
        v["device_planned_bytes"].as_u64().unwrap(),
        v["host_planned_bytes"].as_u64().unwrap(),
    );
    assert_eq!(v["device_budget_bytes"].as_u64().unwrap(), 96 << 30);
    assert_eq!(v["device"]["weights_bytes"].as_u64().unwrap(), 82208358400);
    assert!(
        device > 82208358400 && device <= v["device"]["usable_bytes"].as_u64().unwrap(),
        "{v}"
    );
    assert_eq!(v["planned_bytes"].as_u64().unwrap(), device + host);
    assert!(
        host < 2 << 30,
        "the host keeps buffers, not weights: {host}"
    );
    let seqs = v["full_context_sequences"].as_u64().unwrap();
    assert!(
        seqs >= 1,
        "sequences of 4096 tokens beside one copy: {seqs}"
    );
    // two copies' worth of weights do not fit
    let mut two = args.to_vec();
    two[3] = "164416716800";
    let v2 = json(&abserve(&two));
    assert_eq!(v2["fits"], false);
    assert_eq!(v2["copies_that_fit"].as_u64().unwrap(), 0);
    // the table says the same in words
    let no_json: Vec<&str> = args.iter().copied().filter(|a| *a != "--json").collect();
    let table = abserve(&no_json);
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(
        t.contains("model copies that fit") && t.contains("fits"),
        "{t}"
    );
}

/// The default model with 20 of its 30 layers on a (hypothetical) 1 GiB device: the plan's
/// device part holds those layers' weights and KV, the host the rest; the table says so too.
#[test]
fn plan_splits_an_offloaded_model_between_device_and_host() {
    let m = model();
    let h = abserve_engine::gguf::GgufHeader::read(&m).unwrap();
    let args = [
        "plan",
        "--json",
        "--model",
        m.to_str().unwrap(),
        "--device-memory",
        "1GiB",
        "--gpu-layers",
        "20",
        "--context",
        "2048",
    ];
    let v = json(&abserve(&args));
    let d = &v["device"];
    assert_eq!(
        (d["layers_offloaded"].as_u64(), d["n_layer"].as_u64()),
        (Some(20), Some(30))
    );
    assert_eq!(
        d["weights_bytes"].as_u64().unwrap(),
        h.offloaded_bytes(30, 20)
    );
    let kv = v["kv_bytes"].as_u64().unwrap();
    assert_eq!(
        d["kv_bytes"].as_u64().unwrap(),
        v["kv_cells"].as_u64().unwrap() * (v["kv_bytes_per_token"].as_u64().unwrap() * 20 / 30)
    );
    assert!(d["kv_bytes"].as_u64().unwrap() < kv);
    assert!(v["device_planned_bytes"].as_u64().unwrap() <= d["usable_bytes"].as_u64().unwrap());
    assert_eq!(
        v["planned_bytes"].as_u64().unwrap(),
        v["host_planned_bytes"].as_u64().unwrap() + v["device_planned_bytes"].as_u64().unwrap()
    );
    let table = abserve(
        &args[..1]
            .iter()
            .chain(&args[2..])
            .copied()
            .collect::<Vec<_>>(),
    );
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(
        t.contains("layers offloaded           20 of 30")
            && t.contains("planned on the device")
            && t.contains("planned on the host"),
        "{t}"
    );
    // a CPU build cannot offload for real
    let out = abserve(&[
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--gpu-layers",
        "3",
        "--prompt",
        "hi",
    ]);
    assert_clean_error(&out, "--gpu-layers needs a GPU device");
}

#[test]
fn generate_runs_prompts_concurrently_and_reports_memory() {
    let m = model();
    let out = abserve(&[
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--memory-budget",
        "512MiB",
        "--context",
        "512",
        "--threads",
        "2",
        "--prompt",
        "The capital of France is",
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "8",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0]["text"].as_str().unwrap().contains("Paris"));
    assert_eq!(lines[1]["completion_tokens"], 8);
    let summary = &lines[2]["summary"];
    assert!(summary["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert!(summary["plan"]["kv_cells"].as_u64().unwrap() > 0);
}

#[test]
fn missing_model_is_one_clear_error() {
    let out = abserve(&[
        "generate",
        "--model",
        "/nonexistent/model.gguf",
        "--prompt",
        "hi",
    ]);
    assert_clean_error(&out, "cannot open model file");
    let out = abserve(&["plan", "--model", "/nonexistent/model.gguf"]);
    assert_clean_error(&out, "cannot open model file");
}

#[test]
fn corrupt_models_are_one_clear_error() {
    let dir = std::env::temp_dir().join(format!("abserve-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a model at all, just some text").unwrap();
    assert_clean_error(
        &abserve(&[
            "generate",
            "--model",
            garbage.to_str().unwrap(),
            "--prompt",
            "hi",
        ]),
        "not a GGUF file",
    );
    // the real header cut short: the tensor table or data is missing
    let real = std::fs::read(model()).unwrap();
    let truncated = dir.join("truncated.gguf");
    std::fs::write(&truncated, &real[..real.len() / 2]).unwrap();
    assert_clean_error(
        &abserve(&[
            "generate",
            "--model",
            truncated.to_str().unwrap(),
            "--prompt",
            "hi",
        ]),
        "truncated",
    );
    let header_only = dir.join("header.gguf");
    std::fs::write(&header_only, &real[..4096]).unwrap();
    assert_clean_error(
        &abserve(&["plan", "--model", header_only.to_str().unwrap()]),
        "corrupt or truncated",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn budget_too_small_names_every_number() {
    let m = model();
    let out = abserve(&[
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--memory-budget",
        "64MiB",
        "--prompt",
        "hi",
    ]);
    assert_clean_error(&out, "does not fit the memory budget");
    let err = String::from_utf8_lossy(&out.stderr);
    for part in [
        "weights 96576768",
        "minimum KV",
        "compute",
        "usable",
        "budget 67108864",
    ] {
        assert!(err.contains(part), "'{part}' missing from: {err}");
    }
}

#[test]
fn prompt_longer_than_context_is_one_clear_error() {
    let m = model();
    let long = "word ".repeat(200);
    let out = abserve(&[
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--memory-budget",
        "512MiB",
        "--context",
        "64",
        "--prompt",
        &long,
    ]);
    assert_clean_error(&out, "maximum context length is 64 tokens");
    assert_clean_error(&out, "your prompt has 201 tokens");
}

#[test]
fn bad_flags_exit_2() {
    let out = abserve(&["plan", "--memory-budget", "lots"]);
    assert_eq!(out.status.code(), Some(2));
    let out = abserve(&["plan", "--kv-type", "q3"]);
    assert_eq!(out.status.code(), Some(2));
}
