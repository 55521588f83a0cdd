//! Adapter lanes on the real default model (issue 29): the slots divided between llama.cpp
//! contexts on the one model's weights, each applying its own adapter set, decoded side by
//! side.
//!
//! - four adapter sets in four lanes at once give what each gives alone on one context (up to
//!   near-ties: llama.cpp's CPU kernels round a batch of rows differently from one row);
//! - a prompt computed in one lane is copied to a request of the same set in another lane
//!   through host memory, and that request answers as if it had computed the prompt itself;
//! - the plan counts one compute buffer per lane, and llama.cpp allocates no more than it;
//! - lanes need split KV streams: a unified cache is refused, named.

mod common;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use abserve_engine::adapters::{adapter_set, AdapterSet};
use abserve_engine::prepare::Tokenizer;
use abserve_engine::{Engine, EngineConfig, Request, SamplingParams};
use abserve_protocol::Adapter;
use common::lora;

/// The tests of this file run one at a time: what llama.cpp allocated is read from its log,
/// and a context whose adapter set changes logs its compute buffers again.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TEST: Mutex<()> = Mutex::new(());
    TEST.lock().unwrap_or_else(|p| p.into_inner())
}

fn engine(adapters: &[PathBuf], lanes: u64, tweak: impl FnOnce(&mut EngineConfig)) -> Engine {
    let mut cfg = common::config();
    cfg.adapters = adapters.to_vec();
    cfg.adapter_lanes = lanes;
    cfg.n_batch = 64;
    cfg.max_sequences = 8;
    tweak(&mut cfg);
    Engine::start(cfg).unwrap()
}

fn set(engine: &Engine, path: Option<&PathBuf>) -> AdapterSet {
    let Some(path) = path else {
        return AdapterSet::default();
    };
    let named = [Adapter {
        path: path.display().to_string(),
        scale: 1.0,
    }];
    adapter_set(engine.adapters(), Some(&named)).unwrap().0
}

fn under(prompt: &[i32], max_tokens: u32, adapters: &AdapterSet) -> Request {
    Request {
        adapters: adapters.clone(),
        params: SamplingParams {
            logprobs: Some(2),
            ..SamplingParams::greedy(max_tokens)
        },
        ..Request::new(prompt.to_vec(), SamplingParams::greedy(max_tokens))
    }
}

#[test]
fn four_sets_in_four_lanes_equal_each_alone_and_the_plan_counts_every_lane() {
    let _serial = one_at_a_time();
    let loras = [lora(1), lora(2), lora(3)];
    let lanes = engine(&loras, 4, |_| {});
    let plan = lanes.plan();
    assert_eq!(plan.lanes, 4);
    // one lane's compute buffers, four times (the lanes have 2 of the 8 slots each), and the
    // process's runtime allowance once
    let one = engine(&loras, 1, |c| c.max_sequences = 2);
    let runtime = abserve_engine::plan::COMPUTE_RUNTIME_BYTES;
    assert_eq!(
        plan.compute_bytes - runtime,
        4 * (one.plan().compute_bytes - runtime)
    );
    let got = lanes.measured().llama;
    eprintln!(
        "4 lanes: planned compute {} B, llama.cpp compute {} B + output {} B",
        plan.compute_bytes, got.compute, got.output
    );
    assert!(got.compute + got.output <= plan.compute_bytes);
    assert!(
        got.compute > 3 * one.measured().llama.compute,
        "four contexts' compute buffers: {} vs one {}",
        got.compute,
        one.measured().llama.compute
    );
    // llama.cpp prints each buffer in MiB with two decimals
    assert!(
        got.kv.abs_diff(plan.kv_bytes) <= 4 * 5243,
        "the lanes' streams together are the plan's KV: {} vs {}",
        got.kv,
        plan.kv_bytes
    );

    let sets: Vec<AdapterSet> = [None, Some(&loras[0]), Some(&loras[1]), Some(&loras[2])]
        .iter()
        .map(|p| set(&lanes, *p))
        .collect();
    let prompts: Vec<Vec<i32>> = ["Write about the sea.", "List three fruits:"]
        .iter()
        .map(|p| lanes.prompt_tokens(p))
        .collect();
    let mut alone = Vec::new();
    for s in &sets {
        for p in &prompts {
            alone.push(common::collect(one.submit(under(p, 16, s)).unwrap()).unwrap());
        }
    }
    let rxs: Vec<_> = sets
        .iter()
        .flat_map(|s| prompts.iter().map(move |p| under(p, 16, s)))
        .map(|r| lanes.submit(r).unwrap())
        .collect();
    let together = common::tokens_of_all(rxs);
    let mut identical = 0;
    for (i, (t, a)) in together.iter().zip(&alone).enumerate() {
        match common::parts(t, a) {
            None => identical += 1,
            Some((k, gap)) => {
                eprintln!("sequence {i}: parts from its solo run at token {k}, top-2 gap {gap:.3}");
                assert!(
                    gap < 0.25,
                    "sequence {i} parted at a confident token (gap {gap})"
                );
            }
        }
    }
    eprintln!("4 lanes: {identical} of 8 identical to their solo runs over 16 tokens");
    assert!(
        identical * 2 >= alone.len(),
        "only {identical} of 8 identical"
    );
    for i in 0..2 {
        assert_ne!(
            alone[2 + i].tokens,
            alone[4 + i].tokens,
            "two adapters agreed"
        );
    }
}

#[test]
fn a_prompt_is_copied_across_lanes_through_host_memory() {
    let _serial = one_at_a_time();
    let a = lora(1);
    // two lanes of one slot each: a second request of a's set finds a's lane full
    let lanes = engine(std::slice::from_ref(&a), 2, |c| c.max_sequences = 2);
    let under_a = set(&lanes, Some(&a));
    let long = lanes
        .prompt_tokens(&"The history of the lighthouse keepers of the north coast. ".repeat(6));
    let first = lanes.submit(under(&long, 24, &under_a)).unwrap();
    let second = lanes.submit(under(&long, 8, &under_a)).unwrap();
    let (first, second) = (
        common::collect(first).unwrap(),
        common::collect(second).unwrap(),
    );
    let shared = first.done.shared_prompt_tokens + second.done.shared_prompt_tokens;
    assert!(
        shared > 0,
        "the second request should take the first one's prompt"
    );
    let one = engine(std::slice::from_ref(&a), 1, |c| c.max_sequences = 1);
    let alone = common::collect(one.submit(under(&long, 8, &under_a)).unwrap()).unwrap();
    let later = if second.done.shared_prompt_tokens > 0 {
        &second
    } else {
        &first
    };
    if let Some((k, gap)) = common::parts(&later.tokens[..8.min(later.tokens.len())], &alone) {
        assert!(
            gap < 0.25,
            "the copied prompt parts from computing it at token {k} (gap {gap})"
        );
    }
}

#[test]
fn lanes_need_split_streams() {
    let mut cfg = common::config();
    cfg.adapter_lanes = 2;
    cfg.kv_unified = true;
    let e = Engine::start(cfg).err().expect("refused");
    assert!(
        e.to_string()
            .contains("--adapter-lanes 2 needs split KV streams"),
        "{e}"
    );
}
