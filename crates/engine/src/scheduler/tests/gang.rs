//! Group submissions (a fan-out, `n` choices, a multi-prompt completion): the members are
//! admitted in one step or all wait, a later request does not take the slots the group waits
//! for, and each member's tokens equal its solo run.

use super::*;

fn gang(s: &mut Scheduler, prompts: &[Vec<i32>], max_tokens: u32) -> Vec<UnboundedReceiver<Event>> {
    let (members, rxs): (Vec<_>, Vec<_>) = prompts
        .iter()
        .map(|p| {
            let (tx, rx) = unbounded_channel();
            let req = Request {
                prompt: p.clone(),
                params: SamplingParams::greedy(max_tokens),
                group: Some("g".into()),
                probe: false,
                class: Default::default(),
                priority: 0,
                kv_share: None,
                constraint: None,
                adapters: Default::default(),
                lease: Default::default(),
            };
            ((req, tx), rx)
        })
        .unzip();
    let (_, permits) = InFlight::take(&s.stats, members.len(), Default::default());
    let members = members
        .into_iter()
        .zip(permits)
        .map(|((r, tx), p)| (r, tx, p))
        .collect();
    s.enqueue_gang(members);
    rxs
}

/// The admission order of a request, once it was admitted (the event stays for `drain`'s
/// caller: it is read from a peeked copy of the stream).
fn admitted(rx: &mut UnboundedReceiver<Event>, seen: &mut Option<u64>, toks: &mut Vec<i32>) {
    while let Ok(e) = rx.try_recv() {
        match e {
            Event::Admitted { order, .. } => *seen = Some(order),
            Event::Token { token, .. } => toks.push(token),
            Event::Done(_) => {}
            Event::Error(e) => panic!("unexpected error {e}"),
        }
    }
}

fn gang_waits_whole(mut s: Scheduler, mut f: Fake) {
    // four long requests hold four of the six slots
    let mut long: Vec<_> = (0..4)
        .map(|i| submit(&mut s, prompt(100 + i, 20), 40, "long"))
        .collect();
    s.step(&mut f);
    assert_eq!(s.n_running(), 4);
    // a group of four (n = 4 of one prompt) and then a single request
    let p = prompt(7, 30);
    let mut members = gang(&mut s, &vec![p.clone(); 4], 12);
    let mut later = submit(&mut s, prompt(9, 10), 5, "later");
    let mut orders = vec![None; 4];
    let mut toks = vec![vec![]; 4];
    let (mut later_order, mut later_toks) = (None, vec![]);
    let mut steps = 0;
    while !s.is_idle() {
        s.step(&mut f);
        assert_eq!(
            s.used_cells(),
            f.used(),
            "accounting disagrees with the cache"
        );
        for (k, rx) in members.iter_mut().enumerate() {
            admitted(rx, &mut orders[k], &mut toks[k]);
        }
        admitted(&mut later, &mut later_order, &mut later_toks);
        for rx in &mut long {
            while rx.try_recv().is_ok() {}
        }
        let n_in = orders.iter().filter(|o| o.is_some()).count();
        assert!(
            n_in == 0 || n_in == 4,
            "step {steps}: {n_in} of 4 members admitted"
        );
        if n_in == 0 {
            // while the group waits, the single request behind it does not take its slots
            assert!(
                later_order.is_none(),
                "a later request went before the waiting group"
            );
        }
        steps += 1;
        assert!(steps < 10_000);
    }
    let orders: Vec<u64> = orders.into_iter().map(|o| o.unwrap()).collect();
    let (lo, hi) = (orders.iter().min().unwrap(), orders.iter().max().unwrap());
    assert_eq!(
        hi - lo,
        3,
        "the members were admitted one after another: {orders:?}"
    );
    assert!(later_order.unwrap() > *hi);
    let want = solo(&p, 12);
    for t in toks {
        assert_eq!(t, want, "a member's tokens differ from its solo run");
    }
    assert_eq!(later_toks, solo(&prompt(9, 10), 5));
}

/// Requests are admitted oldest first (no fairness window: the single request submitted after
/// the group is never picked while the group waits).
fn oldest_first(mut cfg: SchedulerConfig) -> Scheduler {
    cfg.fair_window = Duration::ZERO;
    Scheduler::new(cfg, Arc::new(EngineStats::default()))
}

#[test]
fn a_group_is_admitted_in_one_step_or_waits_whole_with_split_streams() {
    let s = oldest_first(SchedulerConfig::split(6, 128, 128));
    gang_waits_whole(s, Fake::split(6, 128));
}

#[test]
fn a_group_is_admitted_in_one_step_or_waits_whole_in_a_unified_cache() {
    let s = oldest_first(SchedulerConfig::new(6 * 128, 6, 128));
    gang_waits_whole(s, Fake::new(6 * 128));
}

#[test]
fn a_group_that_fits_runs_at_once_and_a_single_member_group_is_a_plain_request() {
    let mut s = sched(1024, 8, 256);
    let mut f = Fake::new(1024);
    let prompts: Vec<Vec<i32>> = (0..8).map(|i| prompt(i, 12)).collect();
    let mut rxs = gang(&mut s, &prompts, 6);
    s.step(&mut f);
    assert_eq!(
        s.n_running(),
        8,
        "all eight members run from the first step"
    );
    run(&mut s, &mut f);
    for (rx, p) in rxs.iter_mut().zip(&prompts) {
        assert_eq!(drain(rx).0, solo(p, 6));
    }
    let mut one = gang(&mut s, &[prompt(3, 9)], 4);
    run(&mut s, &mut f);
    assert_eq!(drain(&mut one[0]).0, solo(&prompt(3, 9), 4));
}
