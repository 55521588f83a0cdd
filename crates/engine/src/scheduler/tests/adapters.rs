//! Sequences under different LoRA adapter sets: sets take turns at the context (or all decode
//! in every step with `adapter_turn = 0`), the set applied before its decode, and KV reused
//! only under the set that computed it (the fake tags every position with the set it was
//! computed under, so borrowed KV changes the tokens).

use super::*;
use crate::adapters::AdapterSet;

fn set(name: &str, scale: f32) -> AdapterSet {
    AdapterSet::new([(name.into(), scale)], "adapters").unwrap()
}

fn submit_with(s: &mut Scheduler, p: &[i32], adapters: AdapterSet) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    let mut r = Request::new(p.to_vec(), SamplingParams::greedy(12));
    r.adapters = adapters;
    s.enqueue_counted(r, tx);
    rx
}

fn split_sched(slots: usize) -> (Scheduler, Fake) {
    let s = Scheduler::new(
        SchedulerConfig::split(slots, 128, 128),
        Arc::new(EngineStats::default()),
    );
    (s, Fake::split(slots, 128))
}

/// A scheduler on `slots` split streams in `lanes` adapter lanes, and its fake backend.
fn lanes_sched(slots: usize, lanes: usize) -> (Scheduler, Fake) {
    let mut cfg = SchedulerConfig::split(slots, 128, 128);
    cfg.lanes = lanes;
    let s = Scheduler::new(cfg, Arc::new(EngineStats::default()));
    (s, Fake::lanes(slots, 128, lanes))
}

/// Each request's tokens and completion (every one finished).
fn finished(rxs: &mut [UnboundedReceiver<Event>]) -> Vec<(Vec<i32>, Completion)> {
    rxs.iter_mut()
        .map(|rx| {
            let (t, d) = drain(rx);
            (t, d.expect("finished"))
        })
        .collect()
}

/// Tokens and shared prompt tokens of each request run alone, in a fresh scheduler.
fn alone(p: &[i32], adapters: AdapterSet) -> Vec<i32> {
    let (mut s, mut f) = split_sched(1);
    let mut rx = submit_with(&mut s, p, adapters);
    run(&mut s, &mut f);
    drain(&mut rx).0
}

#[test]
fn sets_run_side_by_side_as_each_alone_and_never_share_kv() {
    let p = prompt(3, 40);
    let sets = [
        AdapterSet::default(),
        set("a.gguf", 1.0),
        set("b.gguf", 1.0),
        set("a.gguf", 0.5),
        set("a.gguf", 1.0),
    ];
    let (mut s, mut f) = split_sched(5);
    let mut rxs: Vec<_> = sets
        .iter()
        .map(|a| submit_with(&mut s, &p, a.clone()))
        .collect();
    run(&mut s, &mut f);
    let got = finished(&mut rxs);
    for (k, a) in sets.iter().enumerate() {
        assert_eq!(
            got[k].0,
            alone(&p, a.clone()),
            "{} side by side differs from alone",
            a.label()
        );
    }
    // the fake's adapters change the tokens: distinct sets answer differently
    assert_ne!(got[0].0, got[1].0);
    assert_ne!(got[1].0, got[2].0);
    assert_ne!(got[1].0, got[3].0, "a scale is part of the set");
    // the same prompt under another set never took the KV computed under the first: only the
    // second request under a.gguf×1 shares (its twin's prompt, copied while running)
    let shared: Vec<usize> = got.iter().map(|g| g.1.shared_prompt_tokens).collect();
    assert_eq!(shared[..4], [0, 0, 0, 0], "{shared:?}");
    assert!(shared[4] > 0, "the same set still shares: {shared:?}");
    // each running set was applied before its own decodes
    assert!(f.applied.len() >= 4, "{:?}", f.applied);
}

/// Three sets with two long sequences each: with turns of 4 steps the context changes sets
/// once per turn, every set gets the same share of steps, and the tokens are each alone's;
/// with `adapter_turn = 0` every set is applied in every step.
#[test]
fn sets_take_turns_at_the_context_and_get_equal_steps() {
    let sets = [
        AdapterSet::default(),
        set("a.gguf", 1.0),
        set("b.gguf", 1.0),
    ];
    let prompts = [prompt(1, 20), prompt(2, 20)];
    let applied = |turn: usize| {
        let (mut s, mut f) = split_sched(6);
        s.cfg.adapter_turn = turn;
        let mut rxs = Vec::new();
        for a in &sets {
            for p in &prompts {
                rxs.push(submit_with(&mut s, p, a.clone()));
            }
        }
        // progress per set after each step: generated tokens so far
        let mut shares = Vec::new();
        for _ in 0..12 {
            s.step(&mut f);
            let mut per_set = [0usize; 3];
            for a in &s.running {
                per_set[a.seq.adapters as usize] += a.seq.generated();
            }
            shares.push(per_set);
        }
        let first_12 = f.applied.clone();
        run(&mut s, &mut f);
        let outs: Vec<Vec<i32>> = rxs.iter_mut().map(|rx| drain(rx).0).collect();
        (first_12, shares, outs)
    };
    let (turns, shares, outs) = applied(4);
    // 12 steps in turns of 4: a, b, then the base model, each applied once
    assert_eq!(turns, ["a.gguf×1", "b.gguf×1", "base"]);
    assert_eq!(shares[11][0], shares[11][1], "{shares:?}");
    assert_eq!(shares[11][1], shares[11][2], "{shares:?}");
    let (every, _, same) = applied(0);
    assert!(every.len() >= 3 * 11, "every set in every step: {every:?}");
    assert_eq!(
        outs, same,
        "turns change when sequences run, not what they generate"
    );
    for (k, a) in sets.iter().enumerate() {
        for (j, p) in prompts.iter().enumerate() {
            assert_eq!(outs[2 * k + j], alone(p, a.clone()));
        }
    }
}

#[test]
fn a_cached_prefix_is_reused_only_under_the_set_that_computed_it() {
    let p = prompt(5, 40);
    let (mut s, mut f) = split_sched(2);
    let mut first = submit_with(&mut s, &p, set("a.gguf", 1.0));
    run(&mut s, &mut f);
    drain(&mut first);
    assert_eq!(s.cached_prefixes(), 1);
    // the base model's request finds a.gguf's cached prompt and must not take it
    let mut base = submit_with(&mut s, &p, AdapterSet::default());
    run(&mut s, &mut f);
    let (toks, done) = drain(&mut base);
    assert_eq!(done.unwrap().shared_prompt_tokens, 0);
    assert_eq!(toks, alone(&p, AdapterSet::default()));
    // the same set takes it
    let mut again = submit_with(&mut s, &p, set("a.gguf", 1.0));
    run(&mut s, &mut f);
    let (toks, done) = drain(&mut again);
    assert!(done.unwrap().shared_prompt_tokens > 0);
    assert_eq!(toks, alone(&p, set("a.gguf", 1.0)));
}

/// A client sending ever new scales cannot grow the scheduler's table of sets: ids of sets that
/// nothing refers to any more are given again, and a set still in use keeps its id.
#[test]
fn the_table_of_sets_stays_bounded() {
    let (mut s, mut f) = split_sched(2);
    let p = prompt(4, 20);
    for i in 0..1000 {
        let mut rx = submit_with(&mut s, &p, set("a.gguf", 1.0 + i as f32 / 1000.0));
        run(&mut s, &mut f);
        drain(&mut rx);
    }
    assert!(s.sets.len() <= 64 + 4, "{} sets", s.sets.len());
    // a set a waiting sequence was made under keeps its id however many new sets come
    let _waiting = submit_with(&mut s, &p, set("kept.gguf", 1.0));
    let kept_id = s.intern(set("kept.gguf", 1.0));
    for i in 0..200 {
        s.intern(set("b.gguf", 1.0 + i as f32 / 1000.0));
    }
    assert_eq!(s.sets[kept_id as usize], set("kept.gguf", 1.0));
    // and answers are still each set's own
    let mut rx = submit_with(&mut s, &p, set("a.gguf", 3.0));
    run(&mut s, &mut f);
    assert_eq!(drain(&mut rx).0, alone(&p, set("a.gguf", 3.0)));
}

/// Four sets with two sequences each on 8 slots in 4 adapter lanes: each set gets a lane of
/// its own, every lane decodes in every step (all sets progress together, no turns), each
/// lane's set is applied once, and the tokens are each alone's. On one context the same work
/// takes turns and applies sets again and again.
#[test]
fn lanes_give_each_set_a_context_and_decode_every_set_in_every_step() {
    let sets = [
        AdapterSet::default(),
        set("a.gguf", 1.0),
        set("b.gguf", 1.0),
        set("c.gguf", 1.0),
    ];
    let prompts = [prompt(1, 20), prompt(2, 20)];
    let go = |lanes: usize| {
        let mut cfg = SchedulerConfig::split(8, 128, 128);
        cfg.lanes = lanes;
        cfg.adapter_turn = 4;
        let mut s = Scheduler::new(cfg, Arc::new(EngineStats::default()));
        let mut f = Fake::lanes(8, 128, lanes);
        let mut rxs = Vec::new();
        for a in &sets {
            for p in &prompts {
                rxs.push(submit_with(&mut s, p, a.clone()));
            }
        }
        let mut lockstep = true;
        for _ in 0..10 {
            s.step(&mut f);
            let mut per_set = [0usize; 4];
            for a in &s.running {
                per_set[a.seq.adapters as usize] += a.seq.generated();
            }
            lockstep &= per_set.iter().all(|&g| g == per_set[0]);
        }
        let lanes_of_sets: Vec<Vec<usize>> = (0..4u32)
            .map(|set| {
                let mut l: Vec<usize> = s
                    .running
                    .iter()
                    .filter(|a| a.seq.adapters == set)
                    .map(|a| s.lanes.lane_of(a.slot))
                    .collect();
                l.dedup();
                l
            })
            .collect();
        run(&mut s, &mut f);
        let outs: Vec<Vec<i32>> = rxs.iter_mut().map(|rx| drain(rx).0).collect();
        let changes = s.stats.adapter_set_changes.load(Ordering::Relaxed);
        (lockstep, lanes_of_sets, f.applied.len(), changes, outs)
    };
    let (lockstep, lanes_of_sets, applied, changes, outs) = go(4);
    assert!(lockstep, "every set progresses in every step");
    let mut seen: Vec<usize> = lanes_of_sets.iter().map(|l| l[0]).collect();
    assert!(
        lanes_of_sets.iter().all(|l| l.len() == 1),
        "{lanes_of_sets:?}"
    );
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 3], "one lane per set: {lanes_of_sets:?}");
    // the base model's lane starts with it applied; a, b and c once each
    assert_eq!(applied, 3);
    assert_eq!(changes, 3, "the counter counts what the context saw");
    let (one_lockstep, _, one_applied, one_changes, one_outs) = go(1);
    assert!(!one_lockstep, "one context takes turns");
    assert!(one_applied > 3, "{one_applied}");
    assert_eq!(one_changes, one_applied as u64);
    assert_eq!(outs, one_outs, "lanes change when, not what");
    for (k, a) in sets.iter().enumerate() {
        for (j, p) in prompts.iter().enumerate() {
            assert_eq!(outs[2 * k + j], alone(p, a.clone()));
        }
    }
}

/// More sets than lanes: a lane runs two sets in turns, the others one each, and every answer
/// is still its set's alone; a prompt computed in one lane is copied into another lane for a
/// request of the same set.
#[test]
fn lanes_with_more_sets_than_lanes_take_turns_inside_a_lane() {
    let sets = [set("a.gguf", 1.0), set("b.gguf", 1.0), set("c.gguf", 1.0)];
    let p = prompt(7, 40);
    let (mut s, mut f) = lanes_sched(4, 2);
    let mut rxs: Vec<_> = sets
        .iter()
        .map(|a| submit_with(&mut s, &p, a.clone()))
        .collect();
    // a second request of a's, with a's prompt: it shares it wherever it lands
    rxs.push(submit_with(&mut s, &p, sets[0].clone()));
    run(&mut s, &mut f);
    let got = finished(&mut rxs);
    for (k, g) in got.iter().enumerate() {
        assert_eq!(g.0, alone(&p, sets[k % 3].clone()), "request {k}");
    }
    assert!(got[3].1.shared_prompt_tokens > 0 || got[0].1.shared_prompt_tokens > 0);
}

/// Each lane's running sets, by lane.
fn sets_by_lane(s: &Scheduler) -> Vec<Vec<u32>> {
    (0..s.lanes.count())
        .map(|lane| {
            let mut sets: Vec<u32> = s
                .running
                .iter()
                .filter(|a| s.lanes.lane_of(a.slot) == lane)
                .map(|a| a.seq.adapters)
                .collect();
            sets.sort_unstable();
            sets.dedup();
            sets
        })
        .collect()
}

/// A set whose lane is full waits for a slot there rather than join another set's lane (whose
/// sequences would then decode in turns), and a request of that other set, queued later, takes
/// the free slot meanwhile: no lane ever runs two sets, and every answer is its set's alone.
#[test]
fn a_set_waits_for_its_own_lane_rather_than_share_another() {
    let (a, b) = (set("a.gguf", 1.0), set("b.gguf", 1.0));
    let (mut s, mut f) = lanes_sched(4, 2);
    let first = [
        (prompt(1, 20), &a),
        (prompt(2, 20), &a),
        (prompt(3, 20), &b),
    ];
    let mut rxs: Vec<_> = first
        .iter()
        .map(|(p, set)| submit_with(&mut s, p, (*set).clone()))
        .collect();
    s.step(&mut f);
    assert_eq!(s.running.len(), 3);
    // a's lane is full; the free slot is in b's lane
    rxs.push(submit_with(&mut s, &prompt(4, 20), a.clone()));
    s.step(&mut f);
    assert_eq!(
        s.running.len(),
        3,
        "the third a waits: {:?}",
        sets_by_lane(&s)
    );
    rxs.push(submit_with(&mut s, &prompt(5, 20), b.clone()));
    s.step(&mut f);
    assert_eq!(s.running.len(), 4, "b's second takes the slot in b's lane");
    let mut guard = 0;
    while !s.is_idle() {
        s.step(&mut f);
        let lanes = sets_by_lane(&s);
        assert!(lanes.iter().all(|l| l.len() <= 1), "{lanes:?}");
        guard += 1;
        assert!(guard < 1000, "no progress");
    }
    // each lane was given its set once
    assert_eq!(s.stats.adapter_set_changes.load(Ordering::Relaxed), 2);
    let got = finished(&mut rxs);
    let sets = [&a, &a, &b, &a, &b];
    for (k, (p, set)) in [1, 2, 3, 4, 5].iter().zip(sets).enumerate() {
        assert_eq!(got[k].0, alone(&prompt(*p, 20), set.clone()), "request {k}");
    }
}

/// Lanes that empty keep their sets: a request goes to an idle lane that has its set applied
/// rather than to the lowest idle slot, so no set change happens.
#[test]
fn an_idle_lane_that_has_the_set_applied_takes_it() {
    let (a, b) = (set("a.gguf", 1.0), set("b.gguf", 1.0));
    let (mut s, mut f) = lanes_sched(4, 2);
    // a in the first lane, then b in the second
    let mut rxs = vec![submit_with(&mut s, &prompt(1, 20), a.clone())];
    s.step(&mut f);
    rxs.push(submit_with(&mut s, &prompt(2, 20), b.clone()));
    run(&mut s, &mut f);
    assert_eq!(s.stats.adapter_set_changes.load(Ordering::Relaxed), 2);
    let b_lane = (0..2)
        .find(|&l| s.on_lane[l] == b)
        .expect("b is applied to a lane");
    assert_eq!(b_lane, 1);
    rxs.push(submit_with(&mut s, &prompt(3, 20), b.clone()));
    s.step(&mut f);
    assert_eq!(s.running.len(), 1);
    assert_eq!(s.lanes.lane_of(s.running[0].slot), b_lane);
    run(&mut s, &mut f);
    assert_eq!(
        s.stats.adapter_set_changes.load(Ordering::Relaxed),
        2,
        "{:?}",
        f.applied
    );
    assert_eq!(finished(&mut rxs).len(), 3);
}
