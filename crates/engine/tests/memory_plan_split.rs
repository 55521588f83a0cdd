//! Split KV streams (the default): 32 sequences on 8 slots of 256 cells, three times the cells
//! the cache holds in total demand. Every sequence waits for a slot and then fits its own stream,
//! nothing is preempted, nothing fails, and the process's peak RSS stays within the plan + 10%.
//! Alone in its own test binary so that the RSS is this test's only.

mod common;

use abserve_engine::plan::peak_rss;
use abserve_engine::{Engine, SamplingParams};

#[test]
fn thirty_two_sequences_on_eight_streams_all_complete_within_the_plan() {
    let mut cfg = common::config();
    cfg.context = 256;
    cfg.max_sequences = 8;
    let engine = Engine::start(cfg).unwrap();
    let plan = engine.plan().clone();
    assert!(!plan.kv_unified);
    assert_eq!(
        (plan.seq_slots, plan.kv_cells_per_slot, plan.kv_cells),
        (8, 256, 2048)
    );
    let n = 32;
    let max_tokens = 120u32;
    let prompts: Vec<Vec<i32>> = (0..n)
        .map(|i| {
            let extra =
                " Describe it in great detail, with colours, sounds and smells.".repeat(i % 4);
            engine.prompt_tokens(&format!(
                "Tell me a long story about thing number {i}.{extra}"
            ))
        })
        .collect();
    let demand: usize = prompts.iter().map(|p| p.len() + max_tokens as usize).sum();
    assert!(
        demand >= 2 * plan.kv_cells as usize,
        "demand {demand} vs {} cells",
        plan.kv_cells
    );
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(max_tokens)
    };
    let outs = common::run_all(&engine, &prompts, &params);
    let stats = engine.stats();
    assert!(outs
        .iter()
        .all(|o| o.done.completion_tokens == max_tokens as usize));
    assert_eq!(
        stats.preemptions, 0,
        "a stream always holds its own sequence"
    );
    assert!(stats.kv_cells_peak <= plan.kv_cells);
    let peak = peak_rss();
    eprintln!(
        "peak RSS {peak} B vs planned {} B ({:.2}×)",
        plan.planned_bytes,
        peak as f64 / plan.planned_bytes as f64
    );
    assert!(
        peak as f64 <= plan.planned_bytes as f64 * 1.10,
        "peak RSS {peak} over plan {} + 10%",
        plan.planned_bytes
    );
}
