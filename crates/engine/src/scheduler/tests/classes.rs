//! Priority classes (`classes.rs`): strict class order, preemption of the least urgent newest
//! sequence with its answer unchanged (restored from the host store or recomputed), bounded
//! starvation, gangs, a unified cache short of cells, and the queue bound per class.

use super::*;
use crate::request::Class;
use crate::scheduler::classes::MAX_BUMPS;

fn split_store(slots: usize, per: usize, store: usize) -> Scheduler {
    let mut cfg = SchedulerConfig::split(slots, per, per);
    cfg.prefix_store_bytes = store;
    // arrival order among equals, not the fair window's random pick
    cfg.fair_window = Duration::ZERO;
    Scheduler::new(cfg, Arc::new(EngineStats::default()))
}

fn submit_as(
    s: &mut Scheduler,
    prompt: Vec<i32>,
    max_tokens: u32,
    class: Class,
    priority: i32,
) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    s.enqueue_counted(
        Request {
            class,
            priority,
            ..Request::new(prompt, SamplingParams::greedy(max_tokens))
        },
        tx,
    );
    rx
}

/// Batch requests of `prompts` (`max_tokens` each), submitted and run for `steps` steps.
fn start_batch(
    s: &mut Scheduler,
    f: &mut Fake,
    prompts: &[Vec<i32>],
    max_tokens: u32,
    steps: usize,
) -> Vec<UnboundedReceiver<Event>> {
    let rxs = prompts
        .iter()
        .map(|p| submit_as(s, p.clone(), max_tokens, Class::Batch, 0))
        .collect();
    for _ in 0..steps {
        s.step(f);
    }
    rxs
}

/// Tokens, completion and the engine-wide admission order of a finished request.
fn finish(rx: &mut UnboundedReceiver<Event>) -> (Vec<i32>, Completion, u64) {
    let mut toks = vec![];
    let (mut done, mut order) = (None, None);
    while let Ok(e) = rx.try_recv() {
        match e {
            Event::Token { token, .. } => toks.push(token),
            Event::Done(c) => done = Some(c),
            Event::Error(e) => panic!("unexpected error {e}"),
            Event::Admitted { order: o, .. } => {
                assert!(order.is_none(), "admitted twice");
                order = Some(o)
            }
        }
    }
    (toks, done.expect("finished"), order.expect("admitted"))
}

fn class_preemptions(s: &Scheduler, class: Class) -> u64 {
    s.stats.snapshot().classes[class.index()].preemptions
}

/// Steps until `rx` has finished, checking the KV accounting against the fake after each step.
fn run_until_done(
    s: &mut Scheduler,
    f: &mut Fake,
    rx: &mut UnboundedReceiver<Event>,
) -> Vec<Event> {
    let mut seen = vec![];
    for _ in 0..10_000 {
        s.step(f);
        assert_eq!(
            s.used_cells(),
            f.used(),
            "accounting disagrees with the cache"
        );
        while let Ok(e) = rx.try_recv() {
            let done = matches!(e, Event::Done(_));
            seen.push(e);
            if done {
                return seen;
            }
        }
    }
    panic!("did not finish");
}

#[test]
fn a_more_urgent_class_takes_the_slot_of_the_least_urgent_newest_and_answers_are_unchanged() {
    for store in [0, 1 << 20] {
        let mut s = split_store(2, 96, store);
        let mut f = Fake::split(2, 96);
        let batch: Vec<Vec<i32>> = (0..3).map(|i| prompt(i, 20)).collect();
        let mut brx = start_batch(&mut s, &mut f, &batch, 30, 4);
        assert_eq!(s.n_running(), 2, "two batch sequences hold both slots");
        let live = prompt(7, 12);
        let fan = prompt(8, 12);
        let mut frx = submit_as(&mut s, fan.clone(), 6, Class::Fanout, 0);
        let mut irx = submit_as(&mut s, live.clone(), 6, Class::Interactive, 0);
        s.step(&mut f);
        assert_eq!(
            class_preemptions(&s, Class::Batch),
            2,
            "both batch sequences gave their slots up at once"
        );
        run(&mut s, &mut f);
        let (itoks, idone, iorder) = finish(&mut irx);
        let (ftoks, fdone, forder) = finish(&mut frx);
        assert!(iorder < forder, "interactive before fan-out");
        assert_eq!(itoks, solo(&live, 6));
        assert_eq!(ftoks, solo(&fan, 6));
        assert_eq!((idone.preemptions, fdone.preemptions), (0, 0));
        let mut preempted = 0;
        for (p, rx) in batch.iter().zip(brx.iter_mut()) {
            let (toks, done, _) = finish(rx);
            assert_eq!(
                toks,
                solo(p, 30),
                "a preempted sequence answers as if it never was"
            );
            assert_eq!(done.completion_tokens, 30);
            preempted += done.preemptions;
        }
        assert_eq!(preempted, 2);
        let restores = s.stats.prefix_restores.load(Ordering::Relaxed);
        assert_eq!(
            restores > 0,
            store > 0,
            "with a host store the preempted KV is restored, without it recomputed"
        );
        assert_eq!(class_preemptions(&s, Class::Interactive), 0);
        assert_eq!(class_preemptions(&s, Class::Fanout), 0);
    }
}

#[test]
fn waiting_requests_are_admitted_strictly_by_class_then_priority_then_arrival() {
    let mut s = split_store(1, 96, 0);
    let mut f = Fake::split(1, 96);
    // one interactive request more urgent than any other holds the only slot
    let mut first = submit_as(&mut s, prompt(1, 10), 4, Class::Interactive, -10);
    s.step(&mut f);
    let asked = [
        (Class::Batch, 0),
        (Class::Fanout, 0),
        (Class::Batch, -5),
        (Class::Interactive, 3),
        (Class::Interactive, -2),
        (Class::Fanout, 0),
    ];
    let mut rxs: Vec<_> = asked
        .iter()
        .enumerate()
        .map(|(k, &(c, p))| submit_as(&mut s, prompt(10 + k as i32, 10), 4, c, p))
        .collect();
    run(&mut s, &mut f);
    finish(&mut first);
    let mut by_order: Vec<(u64, usize)> = rxs
        .iter_mut()
        .enumerate()
        .map(|(k, rx)| (finish(rx).2, k))
        .collect();
    by_order.sort();
    let order: Vec<usize> = by_order.into_iter().map(|(_, k)| k).collect();
    // interactive (-2, then 3), fan-out (in arrival order), batch (-5, then 0)
    assert_eq!(order, vec![4, 3, 1, 5, 2, 0]);
    assert_eq!(
        s.stats.preemptions.load(Ordering::Relaxed),
        0,
        "nothing less urgent ran, so nothing was preempted"
    );
}

#[test]
fn a_sequence_preempted_max_bumps_times_keeps_its_slot() {
    let mut s = split_store(1, 128, 0);
    let mut f = Fake::split(1, 128);
    let long = prompt(3, 16);
    let mut brx = submit_as(&mut s, long.clone(), 80, Class::Batch, 0);
    let mut waited_for_batch = None;
    for k in 0..(MAX_BUMPS + 2) {
        for _ in 0..3 {
            s.step(&mut f);
        }
        let mut irx = submit_as(&mut s, prompt(20 + k as i32, 8), 2, Class::Interactive, 0);
        let before = s.stats.completed.load(Ordering::Relaxed);
        run_until_done(&mut s, &mut f, &mut irx);
        if s.stats.completed.load(Ordering::Relaxed) > before + 1 && waited_for_batch.is_none() {
            waited_for_batch = Some(k);
        }
    }
    run(&mut s, &mut f);
    let (toks, done, _) = finish(&mut brx);
    assert_eq!(
        done.preemptions, MAX_BUMPS,
        "preempted exactly MAX_BUMPS times"
    );
    assert_eq!(class_preemptions(&s, Class::Batch), MAX_BUMPS as u64);
    assert_eq!(toks, solo(&long, 80));
    assert_eq!(
        waited_for_batch,
        Some(MAX_BUMPS),
        "the next interactive request waited for the protected batch sequence to finish"
    );
}

#[test]
fn a_fanout_gang_preempts_as_many_batch_sequences_as_it_has_members() {
    let mut s = split_store(3, 96, 1 << 20);
    let mut f = Fake::split(3, 96);
    let batch: Vec<Vec<i32>> = (0..3).map(|i| prompt(30 + i, 20)).collect();
    let mut brx = start_batch(&mut s, &mut f, &batch, 20, 3);
    let gang: Vec<Vec<i32>> = (0..2).map(|i| prompt(40 + i, 10)).collect();
    let (members, mut grx): (Vec<_>, Vec<_>) = gang
        .iter()
        .map(|p| {
            let (tx, rx) = unbounded_channel();
            let (_, mut permit) = InFlight::take(&s.stats, 1, Class::Fanout);
            let req = Request {
                class: Class::Fanout,
                ..Request::new(p.clone(), SamplingParams::greedy(5))
            };
            ((req, tx, permit.remove(0)), rx)
        })
        .unzip();
    s.enqueue_gang(members);
    s.step(&mut f);
    assert_eq!(
        class_preemptions(&s, Class::Batch),
        2,
        "two slots for two members"
    );
    run(&mut s, &mut f);
    for (p, rx) in gang.iter().zip(grx.iter_mut()) {
        assert_eq!(finish(rx).0, solo(p, 5));
    }
    for (p, rx) in batch.iter().zip(brx.iter_mut()) {
        assert_eq!(finish(rx).0, solo(p, 20));
    }
}

#[test]
fn in_a_unified_cache_short_of_cells_a_more_urgent_request_preempts_a_less_urgent_one() {
    let mut s = sched(64, 4, 64);
    let mut f = Fake::new(64);
    let big = prompt(50, 36);
    let mut brx = submit_as(&mut s, big.clone(), 12, Class::Batch, 0);
    for _ in 0..3 {
        s.step(&mut f);
    }
    let live = prompt(51, 28);
    let mut irx = submit_as(&mut s, live.clone(), 4, Class::Interactive, 0);
    s.step(&mut f);
    assert_eq!(class_preemptions(&s, Class::Batch), 1);
    run(&mut s, &mut f);
    let (itoks, _, iorder) = finish(&mut irx);
    let (btoks, bdone, border) = finish(&mut brx);
    assert!(border < iorder, "the batch request was admitted first");
    assert_eq!(itoks, solo(&live, 4));
    assert_eq!(btoks, solo(&big, 12));
    assert_eq!(bdone.preemptions, 1);
}

#[test]
fn the_queue_bound_counts_only_the_class_and_more_urgent_ones() {
    let stats = Arc::new(EngineStats::default());
    let (before, _batch) = InFlight::take(&stats, 12, Class::Batch);
    assert_eq!(before, 0);
    let (before, _fan) = InFlight::take(&stats, 2, Class::Fanout);
    assert_eq!(before, 0, "batch work does not fill a fan-out's places");
    let (before, live) = InFlight::take(&stats, 1, Class::Interactive);
    assert_eq!(before, 0, "nor an interactive request's");
    let (before, _more) = InFlight::take(&stats, 1, Class::Batch);
    assert_eq!(before, 12 + 2 + 1, "a batch request counts every class");
    drop(live);
    let s = stats.snapshot();
    assert_eq!(s.inflight, 12 + 2 + 1);
    assert_eq!(
        s.classes.map(|c| c.inflight),
        [0, 2, 13],
        "each place counted in its class until dropped"
    );
}

/// Tokens that arrived on `rx` since it was last read.
fn new_tokens(rx: &mut UnboundedReceiver<Event>) -> usize {
    let mut n = 0;
    while let Ok(e) = rx.try_recv() {
        n += usize::from(matches!(e, Event::Token { .. }));
    }
    n
}

#[test]
fn a_step_that_computes_a_live_first_token_leaves_less_urgent_work_for_the_next() {
    let mut s = split_store(3, 96, 0);
    let mut f = Fake::split(3, 96);
    let batch: Vec<Vec<i32>> = (0..2).map(|i| prompt(60 + i, 20)).collect();
    let mut brx = start_batch(&mut s, &mut f, &batch, 20, 3);
    for rx in brx.iter_mut() {
        new_tokens(rx);
    }
    let live = prompt(62, 12);
    let mut irx = submit_as(&mut s, live.clone(), 5, Class::Interactive, 0);
    s.step(&mut f);
    assert_eq!(s.n_running(), 3, "a free slot: nothing preempted");
    assert_eq!(new_tokens(&mut irx), 1, "the live request's first token");
    for rx in brx.iter_mut() {
        assert_eq!(new_tokens(rx), 0, "batch work skipped that step");
    }
    s.step(&mut f);
    assert_eq!(new_tokens(&mut irx), 1);
    for rx in brx.iter_mut() {
        assert_eq!(new_tokens(rx), 1, "and decodes beside it from the next");
    }
    run(&mut s, &mut f);
    assert_eq!(class_preemptions(&s, Class::Batch), 0);
}

#[test]
fn a_live_first_token_step_leaves_out_live_requests_already_answering() {
    let mut s = split_store(4, 96, 0);
    let mut f = Fake::split(4, 96);
    let batch: Vec<Vec<i32>> = (0..2).map(|i| prompt(70 + i, 20)).collect();
    let mut brx = start_batch(&mut s, &mut f, &batch, 30, 3);
    let mut first = submit_as(&mut s, prompt(72, 12), 20, Class::Interactive, 0);
    for _ in 0..3 {
        s.step(&mut f);
    }
    let mut answered = new_tokens(&mut first);
    assert!(answered > 0, "the first live request answers");
    for rx in brx.iter_mut() {
        new_tokens(rx);
    }
    let mut second = submit_as(&mut s, prompt(73, 12), 5, Class::Interactive, 0);
    s.step(&mut f);
    assert_eq!(s.n_running(), 4, "a free slot: nothing preempted");
    assert_eq!(
        new_tokens(&mut second),
        1,
        "the second live request's first token"
    );
    assert_eq!(
        new_tokens(&mut first),
        0,
        "the answering live request skipped that step"
    );
    for rx in brx.iter_mut() {
        assert_eq!(new_tokens(rx), 0, "batch work skipped that step");
    }
    s.step(&mut f);
    assert_eq!(new_tokens(&mut first), 1, "and decodes again from the next");
    assert_eq!(new_tokens(&mut second), 1);
    answered += 1;
    run(&mut s, &mut f);
    assert_eq!(answered + new_tokens(&mut first), 20, "its whole answer");
}
