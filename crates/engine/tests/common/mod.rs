//! Helpers for the engine's integration tests: the default model and a request runner.
#![allow(dead_code)]

use std::path::PathBuf;

use abserve_engine::{Completion, Engine, EngineConfig, Event, Request, SamplingParams};
use abserve_engine::plan::Budget;
use tokio::sync::mpsc::UnboundedReceiver;

/// The default model, fetched by scripts/setup.sh into the ignored models/ folder.
pub fn model_path() -> PathBuf {
    if let Ok(p) = std::env::var("ABSERVE_TEST_MODEL") {
        return p.into();
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "default model missing at {}: run scripts/setup.sh first", p.display());
    p
}

pub fn config() -> EngineConfig {
    let mut c = EngineConfig::new(model_path());
    c.budget = Budget::Bytes(1 << 30);
    c.context = 1024;
    c.kv_tokens_cap = Some(8192);
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

pub fn collect(mut rx: UnboundedReceiver<Event>) -> Result<Output, String> {
    let mut tokens = Vec::new();
    let mut text = String::new();
    let mut gaps = Vec::new();
    loop {
        match rx.blocking_recv() {
            Some(Event::Token { token, text: t, logprob }) => {
                tokens.push(token);
                text.push_str(&t);
                if let Some(l) = logprob.filter(|l| l.top.len() >= 2) {
                    gaps.push(l.top[0].1 - l.top[1].1);
                }
            }
            Some(Event::Done(done)) => {
                text.push_str(&done.tail_text);
                return Ok(Output { tokens, text, done, gaps });
            }
            Some(Event::Admitted { .. }) => {}
            Some(Event::Error(e)) => return Err(e),
            None => return Err("channel closed".into()),
        }
    }
}

pub fn greedy(engine: &Engine, prompt: &[i32], max_tokens: u32) -> UnboundedReceiver<Event> {
    engine
        .submit(Request { prompt: prompt.to_vec(), params: SamplingParams::greedy(max_tokens), group: None, priority: false, kv_share: None })
        .expect("submit")
}

/// Runs all prompts concurrently and returns their outputs in order.
pub fn run_all(engine: &Engine, prompts: &[Vec<i32>], params: &SamplingParams) -> Vec<Output> {
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            engine
                .submit(Request { prompt: p.clone(), params: params.clone(), group: None, priority: false, kv_share: None })
                .expect("submit")
        })
        .collect();
    let handles: Vec<_> = rxs.into_iter().map(|rx| std::thread::spawn(move || collect(rx))).collect();
    handles.into_iter().map(|h| h.join().unwrap().expect("request completes")).collect()
}
