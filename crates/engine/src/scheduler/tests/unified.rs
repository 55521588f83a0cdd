//! The unified KV pool: preemption, prefix sharing, the cache of finished prefixes, fairness,
//! quotas, stops.

use super::*;

#[test]
fn overload_preempts_and_preempted_sequences_equal_their_solo_runs() {
    let kv = 96;
    let mut s = sched(kv, 8, 64);
    let mut f = Fake::new(kv);
    let prompts: Vec<Vec<i32>> = (0..8).map(|i| prompt(i, 8 + i as usize)).collect();
    // demand: 8 × (8..15 + 30) ≈ 380 cells, four times the cache
    let mut rxs: Vec<_> = prompts
        .iter()
        .map(|p| submit(&mut s, p.clone(), 30, "g"))
        .collect();
    run(&mut s, &mut f);
    assert_eq!(
        f.no_slot, 0,
        "admission control must keep llama.cpp from running out of slots"
    );
    assert!(
        s.stats.preemptions.load(Ordering::Relaxed) > 0,
        "this load must preempt"
    );
    for (p, rx) in prompts.iter().zip(rxs.iter_mut()) {
        let (toks, done) = drain(rx);
        let done = done.expect("every sequence completes");
        assert_eq!(toks, solo(p, 30), "crowded run differs from the solo run");
        assert_eq!(done.completion_tokens, 30);
    }
    assert_eq!(s.active_cells(), 0);
    s.clear_cache(&mut f);
    assert_eq!(s.used_cells(), 0);
    assert_eq!(f.used(), 0);
}

#[test]
fn a_finished_prefix_is_reused_by_a_later_request_with_the_same_tokens() {
    let system = prompt(5, 40);
    let with = |tail: &[i32]| {
        let mut p = system.clone();
        p.extend_from_slice(tail);
        p
    };
    let mut s = sched(4096, 8, 256);
    let mut f = Fake::new(4096);
    let mut first = submit(&mut s, with(&[7, 8, 9]), 6, "v1");
    run(&mut s, &mut f);
    assert_eq!(drain(&mut first).0, solo(&with(&[7, 8, 9]), 6));
    assert_eq!(s.cached_prefixes(), 1);
    assert_eq!(
        s.active_cells(),
        0,
        "a cached prefix is not counted as in use"
    );
    assert_eq!(s.stats.kv_cells_cached.load(Ordering::Relaxed), 40 + 3 + 5);
    // a later request with the same system prompt computes only what differs
    let p2 = with(&[11, 12]);
    let mut second = submit(&mut s, p2.clone(), 6, "v1");
    run(&mut s, &mut f);
    let (toks, done) = drain(&mut second);
    assert_eq!(
        toks,
        solo(&p2, 6),
        "the reused prefix gives the same tokens as computing it"
    );
    assert_eq!(done.unwrap().shared_prompt_tokens, 40);
    // the same prompt again: everything but its last token comes from the cache
    let mut third = submit(&mut s, p2.clone(), 6, "v1");
    run(&mut s, &mut f);
    let (toks, done) = drain(&mut third);
    assert_eq!(toks, solo(&p2, 6));
    assert_eq!(done.unwrap().shared_prompt_tokens, p2.len() - 1);
    assert_eq!(s.stats.preemptions.load(Ordering::Relaxed), 0);
    // a seeded request computes its whole prompt (bit-identical logits every time) unless it
    // asks for the cache
    for (cache_prompt, shared) in [(None, 0), (Some(true), p2.len() - 1)] {
        let (tx, mut rx) = unbounded_channel();
        let params = SamplingParams {
            seed: Some(7),
            cache_prompt,
            ..SamplingParams::greedy(6)
        };
        s.enqueue_counted(
            Request {
                prompt: p2.clone(),
                params,
                group: None,
                probe: false,
                class: Default::default(),
                priority: 0,
                kv_share: None,
                constraint: None,
                adapters: Default::default(),
                lease: Default::default(),
            },
            tx,
        );
        run(&mut s, &mut f);
        assert_eq!(
            drain(&mut rx).1.unwrap().shared_prompt_tokens,
            shared,
            "cache_prompt {cache_prompt:?}"
        );
    }
}

#[test]
fn cached_prefixes_give_way_to_new_work_before_anything_is_preempted() {
    let kv = 256;
    let mut s = sched(kv, 4, 128);
    let mut f = Fake::new(kv);
    // four finished sequences leave 4 × 59 cells cached and hold every slot
    for i in 0..4 {
        let mut rx = submit(&mut s, prompt(10 + i, 50), 10, "old");
        run(&mut s, &mut f);
        assert!(drain(&mut rx).1.is_some());
    }
    assert_eq!(s.cached_prefixes(), 4);
    assert_eq!(
        s.used_cells(),
        4 * 59,
        "the last sampled token of each never entered the cache"
    );
    // new, unrelated work that needs most of the cache and every slot
    let prompts: Vec<Vec<i32>> = (0..4).map(|i| prompt(50 + i, 40)).collect();
    let mut rxs: Vec<_> = prompts
        .iter()
        .map(|p| submit(&mut s, p.clone(), 20, "new"))
        .collect();
    run(&mut s, &mut f);
    assert_eq!(f.no_slot, 0);
    assert_eq!(
        s.stats.preemptions.load(Ordering::Relaxed),
        0,
        "the cache gave way, nothing running was preempted"
    );
    for (p, rx) in prompts.iter().zip(rxs.iter_mut()) {
        assert_eq!(drain(rx).0, solo(p, 20));
    }
    assert!(s.used_cells() <= kv);
}

#[test]
fn shared_prefix_is_counted_once_and_gives_the_same_tokens() {
    let base = prompt(3, 40);
    let prompts: Vec<Vec<i32>> = (0..8)
        .map(|i| {
            let mut p = base.clone();
            p.extend([2 + i, 3 + i]);
            p
        })
        .collect();
    let mut s = sched(4096, 8, 256);
    let mut f = Fake::new(4096);
    let mut rxs: Vec<_> = prompts
        .iter()
        .map(|p| submit(&mut s, p.clone(), 4, "g"))
        .collect();
    run(&mut s, &mut f);
    let unshared: usize = prompts.iter().map(|p| p.len() + 4).sum();
    assert!(
        f.peak_used * 3 <= unshared,
        "peak {} cells vs {} unshared",
        f.peak_used,
        unshared
    );
    assert!(s.stats.shared_prompt_tokens.load(Ordering::Relaxed) >= 7 * 40);
    for (p, rx) in prompts.iter().zip(rxs.iter_mut()) {
        assert_eq!(drain(rx).0, solo(p, 4));
    }
}

#[test]
fn cancellation_frees_cells_on_the_next_step() {
    let mut s = sched(1024, 4, 512);
    let mut f = Fake::new(1024);
    let mut keep = submit(&mut s, prompt(1, 20), 100, "g");
    let gone = submit(&mut s, prompt(2, 20), 100, "g");
    for _ in 0..5 {
        s.step(&mut f);
    }
    let owners = |f: &Fake| {
        f.cells
            .iter()
            .flatten()
            .flat_map(|c| c.seqs.iter().copied())
            .collect::<BTreeSet<i32>>()
    };
    assert_eq!(owners(&f).len(), 2);
    drop(gone);
    s.step(&mut f);
    // one step later only the kept sequence holds cells
    assert_eq!(owners(&f).len(), 1);
    assert_eq!(s.used_cells(), f.used());
    assert_eq!(s.stats.cancellations.load(Ordering::Relaxed), 1);
    drop(keep.try_recv());
}

#[test]
fn admission_is_fair_between_variants_submitted_in_a_fixed_order() {
    let mut first_a = 0;
    let rounds = 200;
    let mut s = sched(4096, 1, 512);
    let mut f = Fake::new(4096);
    for r in 0..rounds {
        let mut a = submit(&mut s, prompt(r, 5), 1, "A");
        let _b = submit(&mut s, prompt(r, 5), 1, "B");
        s.step(&mut f);
        // one slot: exactly one of the two finished in the first step
        if drain(&mut a).1.is_some() {
            first_a += 1;
        }
        run(&mut s, &mut f);
    }
    let share = first_a as f64 / rounds as f64;
    assert!(
        (0.4..=0.6).contains(&share),
        "variant A went first {share:.2} of the time"
    );
}

#[test]
fn without_admission_control_the_cache_runs_out() {
    let kv = 48;
    let mut cfg = SchedulerConfig::new(kv, 8, 64);
    cfg.admission_control = false;
    let mut s = Scheduler::new(cfg, Arc::new(EngineStats::default()));
    let mut f = Fake::new(kv);
    let _rxs: Vec<_> = (0..8)
        .map(|i| submit(&mut s, prompt(i, 10), 30, "g"))
        .collect();
    for _ in 0..200 {
        s.step(&mut f);
    }
    assert!(f.no_slot > 0, "the fake cache should have refused a batch");
}

#[test]
fn eog_stops_and_stop_strings_cut() {
    let mut s = sched(4096, 4, 512);
    let mut f = Fake::new(4096);
    f.eog = true;
    let mut rxs: Vec<_> = (0..20)
        .map(|i| submit(&mut s, prompt(i, 6), 200, "g"))
        .collect();
    run(&mut s, &mut f);
    let stopped = rxs
        .iter_mut()
        .map(|rx| drain(rx).1.unwrap().finish_reason)
        .filter(|r| *r == FinishReason::Stop)
        .count();
    assert!(
        stopped > 0,
        "some sequences should hit the end-of-generation token"
    );
    // stop string on the fake's "<n>" pieces
    let (tx, mut rx) = unbounded_channel();
    let p = prompt(7, 6);
    let first = solo(&p, 1)[0];
    s.enqueue_counted(
        Request {
            prompt: p,
            params: SamplingParams {
                stop: vec![format!("<{first}>")],
                ..SamplingParams::greedy(50)
            },
            group: None,
            probe: false,
            class: Default::default(),
            priority: 0,
            kv_share: None,
            constraint: None,
            adapters: Default::default(),
            lease: Default::default(),
        },
        tx,
    );
    f.eog = false;
    run(&mut s, &mut f);
    let (toks, done) = drain(&mut rx);
    assert_eq!(toks.len(), 1);
    assert_eq!(done.unwrap().finish_reason, FinishReason::Stop);
}

#[test]
fn a_group_with_a_kv_share_never_holds_more_and_others_keep_running() {
    let kv = 400;
    let mut s = sched(kv, 16, 128);
    let mut f = Fake::new(kv);
    let mut flood = vec![];
    for i in 0..12 {
        let (tx, rx) = unbounded_channel();
        s.enqueue_counted(
            Request {
                prompt: prompt(i, 20),
                params: SamplingParams::greedy(40),
                group: Some("capped".into()),
                probe: false,
                class: Default::default(),
                priority: 0,
                kv_share: Some(0.25),
                constraint: None,
                adapters: Default::default(),
                lease: Default::default(),
            },
            tx,
        );
        flood.push(rx);
    }
    let mut others: Vec<_> = (0..4)
        .map(|i| submit(&mut s, prompt(100 + i, 10), 20, "free"))
        .collect();
    let mut guard = 0;
    while !s.is_idle() {
        s.step(&mut f);
        let held = s
            .cells_by_group()
            .get(&Some("capped".to_string()))
            .copied()
            .unwrap_or(0);
        assert!(held <= kv / 4, "capped group holds {held} of {kv} cells");
        guard += 1;
        assert!(guard < 100_000);
    }
    for rx in others.iter_mut().chain(flood.iter_mut()) {
        assert!(drain(rx).1.is_some(), "every request completes");
    }
    let peak = s
        .stats
        .groups()
        .into_iter()
        .find(|g| g.0 == "capped")
        .unwrap()
        .2;
    assert!(peak as usize <= kv / 4 && peak > 0);
}
