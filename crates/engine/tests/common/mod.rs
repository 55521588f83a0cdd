//! Helpers for the engine's integration tests: the default model and a request runner.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use abserve_engine::plan::Budget;
use abserve_engine::{Completion, Engine, EngineConfig, Event, Request, SamplingParams};
use tokio::sync::mpsc::UnboundedReceiver;

/// The default model, fetched by scripts/setup.sh into the ignored models/ folder.
pub fn model_path() -> PathBuf {
    if let Ok(p) = std::env::var("ABSERVE_TEST_MODEL") {
        return p.into();
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "default model missing at {}: run scripts/setup.sh first",
        p.display()
    );
    p
}

/// models/test/`name`, a test asset written once by `scripts/<script> MODEL OUT args…` (with
/// the `gguf` package in .venv, which scripts/test.sh installs); never committed.
pub fn asset(name: &str, script: &str, args: &[&str]) -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = root.join("models/test").join(name);
    if out.exists() {
        return out.canonicalize().unwrap();
    }
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let venv = root.join(".venv/bin/python");
    let python = if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    };
    let tmp = out.with_extension(format!("{}.tmp", std::process::id()));
    let status = Command::new(&python)
        .arg(root.join("scripts").join(script))
        .arg(model_path())
        .arg(&tmp)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    assert!(status.success(), "scripts/{script} failed: {status}");
    std::fs::rename(&tmp, &out).unwrap();
    out.canonicalize().unwrap()
}

/// models/test/lora-r8-seed{seed}.gguf: a random rank-8 LoRA adapter of the default model,
/// written once by scripts/test-lora.py.
pub fn lora(seed: u64) -> PathBuf {
    asset(
        &format!("lora-r8-seed{seed}.gguf"),
        "test-lora.py",
        &["--seed", &seed.to_string()],
    )
}

/// A second base model: the default model's first 15 of its 30 blocks
/// (scripts/test-model-layers.py), other weights and KV per token, the same vocabulary.
pub fn half_model() -> PathBuf {
    asset(
        "smol-15-layers.gguf",
        "test-model-layers.py",
        &["--layers", "15"],
    )
}

pub fn config() -> EngineConfig {
    let mut c = EngineConfig::new(model_path());
    c.budget = Budget::Bytes(1 << 30);
    c.context = 1024;
    c.kv_cells_cap = Some(8192);
    c.threads = 2;
    c
}

pub struct Output {
    pub tokens: Vec<i32>,
    pub text: String,
    pub done: Completion,
    /// Per token, the gap between the top two log-probabilities (when logprobs were asked).
    pub gaps: Vec<f32>,
}

/// The engine's own collector, plus the top-2 gaps the agreement tests need.
pub fn collect(rx: UnboundedReceiver<Event>) -> Result<Output, String> {
    let o = abserve_engine::collect_blocking(rx).map_err(|e| e.to_string())?;
    let gaps = o
        .logprobs
        .iter()
        .filter(|l| l.top.len() >= 2)
        .map(|l| l.top[0].1 - l.top[1].1)
        .collect();
    Ok(Output {
        tokens: o.tokens,
        text: o.text,
        done: o.completion,
        gaps,
    })
}

/// Where `got` parts from `alone`'s tokens, with `alone`'s top-2 gap there (`None`: equal
/// throughout the shorter of the two).
pub fn parts(got: &[i32], alone: &Output) -> Option<(usize, f32)> {
    got.iter()
        .zip(&alone.tokens)
        .position(|(x, y)| x != y)
        .map(|k| (k, alone.gaps[k]))
}

pub fn greedy(engine: &Engine, prompt: &[i32], max_tokens: u32) -> UnboundedReceiver<Event> {
    engine
        .submit(Request::new(
            prompt.to_vec(),
            SamplingParams::greedy(max_tokens),
        ))
        .expect("submit")
}

/// Runs all prompts concurrently and returns their outputs in order.
pub fn run_all(engine: &Engine, prompts: &[Vec<i32>], params: &SamplingParams) -> Vec<Output> {
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            engine
                .submit(Request::new(p.clone(), params.clone()))
                .expect("submit")
        })
        .collect();
    let handles: Vec<_> = rxs
        .into_iter()
        .map(|rx| std::thread::spawn(move || collect(rx)))
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap().expect("request completes"))
        .collect()
}

/// The tokens of every receiver, each collected on its own thread (all decoding at once).
pub fn tokens_of_all(rxs: Vec<UnboundedReceiver<Event>>) -> Vec<Vec<i32>> {
    rxs.into_iter()
        .map(|rx| std::thread::spawn(move || collect(rx).unwrap().tokens))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect()
}
