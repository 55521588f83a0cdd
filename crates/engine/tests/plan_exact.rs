//! The plan's KV bytes are what llama.cpp allocates: for several (budget, context, slots)
//! settings in both layouts, the KV buffer llama.cpp reports for the context equals the plan's
//! `kv_bytes` (llama.cpp prints it in MiB with two decimals, so equal within 0.005 MiB).

mod common;

use abserve_engine::plan::Budget;
use abserve_engine::Engine;

#[test]
fn planned_kv_bytes_equal_llama_cpp_kv_buffer() {
    let settings = [
        (512u64 << 20, 512u64, 8u64, false, None),
        (1 << 30, 1000, 64, false, None),
        (420 << 20, 2048, 16, false, None),
        (768 << 20, 256, 12, false, Some(3 * 256)),
        (512 << 20, 512, 8, true, None),
    ];
    for (budget, context, slots, unified, cap) in settings {
        let mut cfg = common::config();
        cfg.budget = Budget::Bytes(budget);
        cfg.context = context;
        cfg.max_sequences = slots;
        cfg.kv_unified = unified;
        cfg.kv_cells_cap = cap;
        let engine = Engine::start(cfg).unwrap();
        let plan = engine.plan();
        let got = engine.measured().llama.kv;
        eprintln!(
            "budget {budget} context {context} slots {slots} unified {unified}: plan {} slots × {} cells = {} B, llama.cpp {} B",
            plan.seq_slots, plan.kv_cells_per_slot, plan.kv_bytes, got
        );
        assert!(
            (got as f64 - plan.kv_bytes as f64).abs() <= 0.005 * 1048576.0,
            "planned KV {} B, llama.cpp allocated {got} B",
            plan.kv_bytes
        );
        if !unified {
            assert_eq!(plan.kv_cells, plan.seq_slots * plan.kv_cells_per_slot);
        }
    }
}
