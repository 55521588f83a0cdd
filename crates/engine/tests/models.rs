//! Several base models in one process: one budget divided between them before anything loads
//! (`models.rs`). The shares sum to the budget, every model's plan fits its share, a combination
//! that does not fit is refused before loading with every number, and two engines in one
//! process each allocate what their plan says and answer as each does alone.

mod common;

use std::sync::Arc;

use abserve_engine::device::FakeDevice;
use abserve_engine::models::{check_all, divide_budget, ModelConfig};
use abserve_engine::plan::Budget;
use abserve_engine::{DeviceHandle, Engine, EngineError};

const MIB: u64 = 1 << 20;

fn two(budget: u64) -> Vec<ModelConfig> {
    let mut base = common::config();
    base.budget = Budget::Bytes(budget);
    let path = common::model_path();
    ["a", "b"]
        .iter()
        .map(|id| ModelConfig::parse(&format!("{id}={}", path.display()), &base).unwrap())
        .collect()
}

#[test]
fn ids_come_from_the_flag_or_the_file_name() {
    let base = common::config();
    let m = ModelConfig::parse("tuned=/x/y/model-b.gguf", &base).unwrap();
    assert_eq!(
        (m.id.as_str(), m.config.model.to_str()),
        ("tuned", Some("/x/y/model-b.gguf"))
    );
    let m = ModelConfig::parse("/x/y/SmolLM2.Q4_1.gguf", &base).unwrap();
    assert_eq!(m.id, "SmolLM2.Q4_1");
    for bad in ["default=/x.gguf", "experiment:a=/x.gguf", "a="] {
        assert!(
            ModelConfig::parse(bad, &base).is_err(),
            "{bad} was accepted"
        );
    }
    let mut dup = two(1 << 30);
    dup[1].id = "a".into();
    let e = divide_budget(&mut dup).unwrap_err().to_string();
    assert!(e.contains("'a'"), "{e}");
}

#[test]
fn the_shares_sum_to_the_budget_and_each_plan_fits_its_share() {
    let budget = 1u64 << 30;
    let mut models = two(budget);
    let shares = divide_budget(&mut models).unwrap();
    assert_eq!(
        shares.iter().map(|s| s.host_budget).sum::<u64>(),
        budget,
        "{shares:?}"
    );
    let plans = check_all(&models).unwrap();
    let mut planned = 0;
    for (p, s) in plans.iter().zip(&shares) {
        assert_eq!(p.budget_bytes, s.host_budget);
        assert!(s.host_fixed >= p.weights_bytes && s.host_budget > s.host_fixed);
        assert!(p.host_planned_bytes <= p.usable_bytes, "{p:?}");
        assert!(p.seq_slots >= 1);
        planned += p.host_planned_bytes;
    }
    assert!(
        planned <= budget - budget / 10,
        "planned {planned} of {budget}"
    );
    // one model alone keeps the whole budget
    let mut one = two(budget);
    one.truncate(1);
    let alone = divide_budget(&mut one).unwrap();
    assert_eq!(alone[0].host_budget, budget);
    assert!(check_all(&one).unwrap()[0].kv_cells > plans[0].kv_cells);
}

#[test]
fn share_weights_divide_the_rest_in_proportion_and_still_sum_to_the_budget() {
    let budget = (2u64 << 30) + 7; // a rest that does not divide evenly
    let mut models = two(budget);
    for m in &mut models {
        m.config.kv_cells_cap = None; // the tests' cap would hide the difference in KV
    }
    ModelConfig::set_shares(&mut models, &["a=3".into()]).unwrap();
    let shares = divide_budget(&mut models).unwrap();
    assert_eq!(shares.iter().map(|s| s.host_budget).sum::<u64>(), budget);
    let rest: Vec<u64> = shares
        .iter()
        .map(|s| s.host_budget - s.host_fixed)
        .collect();
    assert!(rest[0].abs_diff(3 * rest[1]) <= 3, "{rest:?}");
    let plans = check_all(&models).unwrap();
    assert!(plans[0].kv_cells > plans[1].kv_cells);
    for (spec, words) in [
        ("c=1", "no --model has (ids: a, b)"),
        ("a=-1", "positive number"),
        ("a=inf", "positive number"),
        ("a", "not ID=N"),
    ] {
        let e = ModelConfig::set_shares(&mut two(budget), &[spec.into()]).unwrap_err();
        assert!(e.contains(words), "{spec}: {e}");
    }
}

#[test]
fn weights_that_do_not_fit_are_refused_before_loading_with_every_number() {
    let weights = common::config().plan().unwrap().1.weights_bytes;
    // room for one copy of the weights and the margin, not two
    let budget = weights * 3 / 2;
    let e = divide_budget(&mut two(budget)).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, EngineError::Models(_)), "{msg}");
    for part in ["a ", "b ", "host", "usable", "margin 10%"] {
        assert!(msg.contains(part), "'{part}' missing from: {msg}");
    }
    // the weights fit, but not one sequence beside them: that model's plan says so, by name
    let mut tight = two(2 * weights * 10 / 9 + 32 * MIB);
    divide_budget(&mut tight).unwrap();
    let msg = check_all(&tight).unwrap_err().to_string();
    assert!(msg.contains("model 'a' does not fit its share"), "{msg}");
}

#[test]
fn device_shares_sum_to_the_device_budget() {
    let mut models = two(1 << 30);
    let device = DeviceHandle(Arc::new(FakeDevice::new("Fake0", 2 << 30, 0)));
    for m in &mut models {
        m.config.device = Some(device.clone());
        m.config.device_budget = Budget::Fraction(0.5);
    }
    let shares = divide_budget(&mut models).unwrap();
    assert_eq!(shares.iter().map(|s| s.device_budget).sum::<u64>(), 1 << 30);
    for (s, p) in shares.iter().zip(check_all(&models).unwrap()) {
        let d = p.device.as_ref().unwrap();
        assert_eq!(d.budget_bytes, s.device_budget);
        assert_eq!(d.weights_bytes, s.device_fixed);
        assert!(d.planned_bytes <= d.usable_bytes);
        // all layers offloaded: the host keeps no weights beyond what llama.cpp leaves there
        assert!(s.host_fixed < p.weights_bytes);
    }
}

/// The default model and a smaller one of the same family (its first 15 blocks), as `a` and `b`.
fn two_different(budget: u64) -> Vec<ModelConfig> {
    let mut models = two(budget);
    models[1] = ModelConfig::parse(
        &format!("b={}", common::half_model().display()),
        &models[1].config,
    )
    .unwrap();
    models
}

#[test]
fn two_models_in_one_process_allocate_their_plans_and_answer_as_alone() {
    let mut models = two_different(1 << 30);
    for m in &mut models {
        m.config.context = 512;
        m.config.max_sequences = 4;
    }
    divide_budget(&mut models).unwrap();
    let prompt_of = |e: &Engine| e.prompt_tokens("The capital of France is");
    // each alone first, then both engines loaded side by side, decoding at once
    let alone: Vec<Vec<i32>> = models
        .iter()
        .map(|m| {
            let e = Engine::start(m.config.clone()).unwrap();
            common::collect(common::greedy(&e, &prompt_of(&e), 12))
                .unwrap()
                .tokens
        })
        .collect();
    let engines: Vec<Engine> = models
        .iter()
        .map(|m| Engine::start(m.config.clone()).unwrap())
        .collect();
    // per model: the weights and the KV the plan counted are what llama.cpp allocated for that
    // model (it prints MiB with two decimals: equal within 0.005 MiB); its compute and output
    // buffers stay within the plan's compute reservation, which is a bound, not a sum of buffers
    for e in &engines {
        let (plan, got) = (e.plan(), e.measured().llama);
        eprintln!(
            "model {}: weights planned {} B, allocated {} B; KV planned {} B, allocated {} B; \
             compute+output planned {} B, allocated {} B",
            e.model_path().display(),
            plan.weights_bytes,
            got.model,
            plan.kv_bytes,
            got.kv,
            plan.compute_bytes,
            got.compute + got.output
        );
        let near = |a: u64, b: u64| (a as f64 - b as f64).abs() <= 0.005 * MIB as f64;
        assert!(
            near(got.kv, plan.kv_bytes),
            "planned KV {} B, llama.cpp allocated {} B",
            plan.kv_bytes,
            got.kv
        );
        assert!(
            near(got.model, plan.weights_bytes),
            "planned weights {} B, llama.cpp allocated {} B",
            plan.weights_bytes,
            got.model
        );
        assert!(
            got.compute + got.output <= plan.compute_bytes,
            "llama.cpp's compute and output buffers ({} B) exceed the planned compute {} B",
            got.compute + got.output,
            plan.compute_bytes
        );
    }
    let rxs: Vec<_> = engines
        .iter()
        .map(|e| common::greedy(e, &prompt_of(e), 12))
        .collect();
    let together = common::tokens_of_all(rxs);
    assert_eq!(together, alone);
    // two different models: the second's weights and KV per token are its own
    let (a, b) = (engines[0].plan(), engines[1].plan());
    assert!(b.weights_bytes < a.weights_bytes && b.kv_bytes_per_token * 2 == a.kv_bytes_per_token);
    assert_ne!(together[0], together[1]);
}

/// A draft model (`--draft-model`, the same vocabulary): the plan counts its weights and KV —
/// llama.cpp's KV buffers of both contexts together are the plan's `kv_bytes` — it drafts, and
/// the greedy answers are token for token those of an engine that never drafts (one request at
/// a time: requests decoded together round differently, with or without drafts). Two drafts:
/// the default model's first 15 of 30 layers (half the KV per token again; the measured
/// acceptance of this untrained truncation is near zero, docs/benchmarks.md) and the model
/// itself (its greedy drafts are accepted).
#[test]
fn a_draft_model_is_planned_drafts_and_leaves_greedy_answers_as_they_are() {
    let questions = [
        "What is the capital of France?",
        "Name three colours of the rainbow.",
        "Why is the sky blue?",
        "Write one sentence about cats.",
        "What is two plus two?",
        "Give a synonym for happy.",
        "What do bees make?",
        "How many days are in a week?",
        "What is the opposite of cold?",
        "Describe a tree in a few words.",
        "Which planet is closest to the sun?",
        "What language is spoken in Spain?",
        "Say hello in a friendly way.",
        "What is water made of?",
        "Name a fruit that is yellow.",
        "What is the largest ocean?",
        "Tell me a fact about the moon.",
        "What animal says moo?",
        "What is the boiling point of water?",
        "Name a musical instrument.",
    ];
    let answers = |draft: Option<std::path::PathBuf>, unified: bool| {
        let mut cfg = common::config();
        if unified {
            (cfg.kv_unified, cfg.context, cfg.kv_cells_cap) = (true, 128, Some(256));
        }
        cfg.speculative = match draft {
            Some(_) => abserve_engine::Speculation::Always,
            None => abserve_engine::Speculation::Off,
        };
        cfg.draft_model = draft;
        let engine = Engine::start(cfg).unwrap();
        let out: Vec<Vec<i32>> = questions
            .iter()
            .map(|q| {
                let p = engine.prompt_tokens(&format!("Question: {q}\nAnswer:"));
                common::collect(common::greedy(&engine, &p, 24))
                    .unwrap()
                    .tokens
            })
            .collect();
        (
            out,
            engine.stats(),
            engine.plan().clone(),
            engine.measured().llama,
        )
    };
    let (plain, p, plain_plan, _) = answers(None, false);
    assert_eq!(p.draft_tokens, 0);
    for (draft, layers) in [(common::half_model(), 15), (common::model_path(), 30)] {
        let (drafted, d, plan, llama) = answers(Some(draft), false);
        eprintln!(
            "{layers}-layer draft: {} of {} draft model tokens accepted; steps {} with it, {} without",
            d.draft_model_accepted, d.draft_model_tokens, d.steps, p.steps
        );
        assert!(
            d.draft_model_tokens > 0,
            "{layers} layers: the draft model drafted nothing"
        );
        if layers == 30 {
            assert!(
                d.draft_model_accepted * 2 > d.draft_model_tokens,
                "the model as its own draft: {} of {} accepted",
                d.draft_model_accepted,
                d.draft_model_tokens
            );
        }
        for (i, (a, b)) in plain.iter().zip(&drafted).enumerate() {
            assert_eq!(
                a, b,
                "{layers} layers, question {i}: the draft changed the greedy answer"
            );
        }
        // its KV per token in proportion to its layers, its weights and compute counted too
        // (within the same budget a large draft leaves room for fewer slots)
        assert!(plan.kv_cells <= plain_plan.kv_cells && plan.planned_bytes <= plan.usable_bytes);
        assert_eq!(
            plan.draft_kv_bytes_per_token * 30,
            plain_plan.kv_bytes_per_token * layers
        );
        assert_eq!(
            plan.kv_bytes_per_token,
            plain_plan.kv_bytes_per_token + plan.draft_kv_bytes_per_token
        );
        assert!(plan.draft_weights_bytes > 0 && plan.compute_bytes > plain_plan.compute_bytes);
        // llama.cpp prints each context's KV buffer in MiB with two decimals
        let diff = llama.kv.abs_diff(plan.kv_bytes);
        assert!(
            diff <= 2 * 5 * 1024 * 1024 / 1000,
            "{layers} layers: llama.cpp's KV buffers {} B, the plan's kv {} B",
            llama.kv,
            plan.kv_bytes
        );
    }
    // a unified cache of 256 cells, the draft's context laid out alike
    let (plain, _, _, _) = answers(None, true);
    let (drafted, d, _, _) = answers(Some(common::model_path()), true);
    assert!(d.draft_model_accepted > 0, "unified: nothing accepted");
    assert_eq!(plain, drafted, "unified: the draft changed a greedy answer");
}

/// A file that is no model given as the draft is refused before anything loads, named.
#[test]
fn a_draft_that_is_no_model_is_refused_with_its_path() {
    let mut cfg = common::config();
    let lora = common::lora(1);
    cfg.draft_model = Some(lora.clone());
    let e = Engine::start(cfg)
        .err()
        .expect("a LoRA file is no draft model");
    let msg = e.to_string();
    assert!(
        msg.starts_with("--draft-model") && msg.contains(&lora.display().to_string()),
        "{msg}"
    );
}
