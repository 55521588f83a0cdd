//! Split KV streams (the default layout): slot reuse, stream copies, the host store, micro-batches,
//! the ITL target.

use super::*;

fn split_sched(slots: usize, per: usize, ctx: usize) -> Scheduler {
    Scheduler::new(
        SchedulerConfig::split(slots, per, ctx),
        Arc::new(EngineStats::default()),
    )
}

fn with_system(system: &[i32], tail: &[i32]) -> Vec<i32> {
    let mut p = system.to_vec();
    p.extend_from_slice(tail);
    p
}

#[test]
fn split_streams_run_more_requests_than_slots_without_preemption_and_equal_solo_runs() {
    let mut s = split_sched(4, 64, 64);
    let mut f = Fake::split(4, 64);
    let prompts: Vec<Vec<i32>> = (0..12).map(|i| prompt(i, 8 + i as usize)).collect();
    let mut rxs: Vec<_> = prompts
        .iter()
        .map(|p| submit(&mut s, p.clone(), 30, "g"))
        .collect();
    run(&mut s, &mut f);
    assert_eq!(f.no_slot, 0);
    assert_eq!(
        s.stats.preemptions.load(Ordering::Relaxed),
        0,
        "a split stream always holds its sequence"
    );
    for (p, rx) in prompts.iter().zip(rxs.iter_mut()) {
        let (toks, done) = drain(rx);
        assert_eq!(toks, solo(p, 30));
        assert_eq!(done.unwrap().completion_tokens, 30);
    }
    assert!(s.used_cells() <= 4 * 64);
}

#[test]
fn split_streams_reuse_a_slot_in_place_and_copy_from_running_slots() {
    let system = prompt(9, 40);
    let mut s = split_sched(4, 128, 128);
    let mut f = Fake::split(4, 128);
    // 16 requests of one variant one after another: the system prompt is computed once
    let mut computed = 0;
    for i in 0..16 {
        let p = with_system(&system, &[2 + i, 3, 4 + i]);
        let mut rx = submit(&mut s, p.clone(), 5, "v");
        run(&mut s, &mut f);
        let (toks, done) = drain(&mut rx);
        assert_eq!(toks, solo(&p, 5), "request {i}");
        if i > 0 {
            assert!(
                done.unwrap().shared_prompt_tokens >= 40,
                "request {i} reused the system prompt"
            );
        }
        computed = s.stats.prompt_tokens_computed.load(Ordering::Relaxed);
    }
    assert_eq!(
        computed,
        40 + 16 * 3,
        "the 40-token system prompt was computed once"
    );
    assert_eq!(
        s.stats.prefix_copies.load(Ordering::Relaxed),
        0,
        "one after another: always the same slot, no copy"
    );
    // four at once: the first takes the cached slot in place, the others copy its stream
    let prompts: Vec<Vec<i32>> = (0..4)
        .map(|i| with_system(&system, &[50 + i, 51]))
        .collect();
    let mut rxs: Vec<_> = prompts
        .iter()
        .map(|p| submit(&mut s, p.clone(), 5, "v"))
        .collect();
    run(&mut s, &mut f);
    for (p, rx) in prompts.iter().zip(rxs.iter_mut()) {
        let (toks, done) = drain(rx);
        assert_eq!(
            toks,
            solo(p, 5),
            "a copied stream gives the tokens of a computed one"
        );
        assert!(done.unwrap().shared_prompt_tokens >= 40);
    }
    assert_eq!(s.stats.prefix_copies.load(Ordering::Relaxed), 3);
    assert_eq!(
        s.stats.prompt_tokens_computed.load(Ordering::Relaxed),
        computed + 4 * 2
    );
}

#[test]
fn concurrent_requests_wait_for_a_prefix_in_computation_instead_of_computing_it_again() {
    // 8 variants × 16 requests, all submitted at once, 16 slots
    let systems: Vec<Vec<i32>> = (0..8).map(|v| prompt(100 + v, 60)).collect();
    let mut s = split_sched(16, 128, 128);
    let mut f = Fake::split(16, 128);
    let mut all = vec![];
    for r in 0..16 {
        for (v, sys) in systems.iter().enumerate() {
            let p = with_system(sys, &[2 + r, 3 + v as i32]);
            all.push((p.clone(), submit(&mut s, p, 4, &format!("v{v}"))));
        }
    }
    run(&mut s, &mut f);
    for (p, rx) in all.iter_mut() {
        assert_eq!(drain(rx).0, solo(p, 4));
    }
    // a system prompt's last position is computed as part of a chunk; count whole prompts:
    // computed prompt tokens ≤ 2 × 8 × 60 (each prefix at most twice) + 128 × 2 (the tails)
    let computed = s.stats.prompt_tokens_computed.load(Ordering::Relaxed) as usize;
    assert!(
        computed <= 2 * 8 * 60 + 128 * 2,
        "computed {computed} prompt tokens"
    );
    assert_eq!(f.no_slot, 0);
}

#[test]
fn a_decode_batch_of_contiguous_slots_is_one_micro_batch() {
    let mut s = split_sched(8, 64, 64);
    let mut f = Fake::split(8, 64);
    let _rxs: Vec<_> = (0..8)
        .map(|i| submit(&mut s, prompt(i, 2 + i as usize % 3), 20, "g"))
        .collect();
    // first step: 8 prefills of different lengths (one batch); later steps: 8 decodes in slot order
    s.step(&mut f);
    let before = f.ubatches;
    for _ in 0..10 {
        s.step(&mut f);
    }
    assert_eq!(
        f.ubatches - before,
        10,
        "each decode step of 8 contiguous slots is one micro-batch"
    );
    let slots: Vec<i32> = f.batch.iter().map(|b| b.2).collect();
    assert!(
        slots.windows(2).all(|w| w[0] < w[1]),
        "batch in slot order: {slots:?}"
    );
}

#[test]
fn itl_target_holds_back_sequences_that_add_no_throughput() {
    let mut cfg = SchedulerConfig::split(16, 64, 64);
    cfg.max_itl = Some(Duration::from_millis(60));
    let mut s = Scheduler::new(cfg, Arc::new(EngineStats::default()));
    // teach the model a saturated machine: 4 ms + 6 ms per sequence
    for n in 1..=8 {
        s.steps
            .observe(n, Duration::from_secs_f64(0.004 + 0.006 * n as f64));
    }
    let mut f = Fake::split(16, 64);
    let _rxs: Vec<_> = (0..16)
        .map(|i| submit(&mut s, prompt(i, 5), 50, "g"))
        .collect();
    s.step(&mut f);
    assert_eq!(
        s.n_running(),
        9,
        "9 sequences: 58 ms; a 10th only stretches every step"
    );
    assert_eq!(s.stats.itl_held.load(Ordering::Relaxed), 7);
}

#[test]
fn a_prefix_whose_slot_was_reused_comes_back_from_the_host_store() {
    let mut cfg = SchedulerConfig::split(2, 128, 128);
    cfg.prefix_store_bytes = 4096;
    let mut s = Scheduler::new(cfg, Arc::new(EngineStats::default()));
    let mut f = Fake::split(2, 128);
    let system = prompt(42, 50);
    let mut first = submit(&mut s, with_system(&system, &[5, 6]), 4, "a");
    run(&mut s, &mut f);
    assert_eq!(drain(&mut first).0, solo(&with_system(&system, &[5, 6]), 4));
    // two unrelated requests take both slots, so the system prompt's cached slot is reused
    let mut others: Vec<_> = (0..2)
        .map(|i| submit(&mut s, prompt(200 + i, 30), 4, "b"))
        .collect();
    run(&mut s, &mut f);
    others
        .iter_mut()
        .for_each(|rx| assert!(drain(rx).1.is_some()));
    assert!(
        s.cache
            .iter()
            .all(|c| super::kv::common_prefix(&c.tokens, &system) < 16),
        "the slot copy is gone"
    );
    let before = s.stats.prompt_tokens_computed.load(Ordering::Relaxed);
    let p = with_system(&system, &[7, 8, 9]);
    let mut again = submit(&mut s, p.clone(), 4, "a");
    run(&mut s, &mut f);
    let (toks, done) = drain(&mut again);
    assert_eq!(
        toks,
        solo(&p, 4),
        "a restored prefix gives the tokens of a computed one"
    );
    assert!(done.unwrap().shared_prompt_tokens >= 50);
    assert_eq!(s.stats.prefix_restores.load(Ordering::Relaxed), 1);
    assert_eq!(
        s.stats.prompt_tokens_computed.load(Ordering::Relaxed) - before,
        3,
        "only the question was computed"
    );
    assert!(s.store.bytes <= 4096);
}

#[test]
fn new_sequences_join_the_run_of_running_slots_instead_of_scattered_cached_ones() {
    // 8 slots, every one caching a prefix after a first round; then a variant whose prefix
    // sits in one cached slot gets 3 requests and another variant 2: they must decode as one
    // run of consecutive sequence ids (one micro-batch a step), not wherever caches happen to be
    let mut cfg = SchedulerConfig::split(8, 128, 128);
    cfg.prefix_store_bytes = 1 << 20;
    let mut s = Scheduler::new(cfg, Arc::new(EngineStats::default()));
    let mut f = Fake::split(8, 128);
    let systems: Vec<Vec<i32>> = (0..4).map(|v| prompt(300 + v, 40)).collect();
    let mut first: Vec<_> = (0..8)
        .map(|i| {
            submit(
                &mut s,
                with_system(&systems[i % 4], &[2 + i as i32, 9]),
                3 + i as u32,
                "w",
            )
        })
        .collect();
    run(&mut s, &mut f);
    first
        .iter_mut()
        .for_each(|rx| assert!(drain(rx).1.is_some()));
    let cached: Vec<i32> = s.cache.iter().map(|c| c.slot).collect();
    assert!(s.cache.len() >= 6, "the slots cache prefixes: {cached:?}");
    let computed = s.stats.prompt_tokens_computed.load(Ordering::Relaxed);
    let decodes = f.per_decode.len();
    let mut ps = vec![];
    for (v, n) in [(3usize, 3), (1, 2)] {
        for i in 0..n {
            ps.push(with_system(&systems[v], &[60 + i, 61]));
        }
    }
    let mut rxs: Vec<_> = ps
        .iter()
        .map(|p| submit(&mut s, p.clone(), 6, "w"))
        .collect();
    s.step(&mut f);
    let mut slots: Vec<i32> = s.running.iter().map(|a| a.slot).collect();
    slots.sort_unstable();
    assert_eq!(slots.len(), 5);
    assert!(
        slots.windows(2).all(|w| w[1] == w[0] + 1),
        "running slots {slots:?} are one run"
    );
    run(&mut s, &mut f);
    for (p, rx) in ps.iter().zip(rxs.iter_mut()) {
        let (toks, done) = drain(rx);
        assert_eq!(
            toks,
            solo(p, 6),
            "a copied or restored prefix gives the tokens of a computed one"
        );
        assert!(done.unwrap().shared_prompt_tokens >= 40);
    }
    assert!(
        f.per_decode[decodes..].iter().all(|&n| n == 1),
        "one micro-batch a step: {:?}",
        &f.per_decode[decodes..]
    );
    assert_eq!(
        s.stats.prompt_tokens_computed.load(Ordering::Relaxed) - computed,
        5 * 2,
        "only the questions were computed"
    );
}
