//! Prompt-lookup drafts (`speculate.rs`) on the `markov` fake, whose output repeats itself so
//! that drafts are accepted except across the positions that break the pattern: output
//! identical with and without drafts (greedy, and seeded sampling with the same draws), KV
//! accounting equal to the fake's cells after every step (`run`) while rejected drafts are
//! dropped, fewer steps where drafts are accepted, and drafting that stops where they are not.

use super::*;
use crate::scheduler::Speculation;

/// Runs `prompts` with `params` to the end with speculation `on`: each request's tokens, the
/// steps taken and the engine's counters.
fn run_spec(
    mut cfg: SchedulerConfig,
    mut f: Fake,
    on: bool,
    prompts: &[Vec<i32>],
    params: &SamplingParams,
) -> (Vec<Vec<i32>>, u64, StatsSnapshot) {
    cfg.speculative = if on {
        Speculation::Always
    } else {
        Speculation::Off
    };
    let stats = Arc::new(EngineStats::default());
    let mut s = Scheduler::new(cfg, stats.clone());
    let mut rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (tx, rx) = unbounded_channel();
            s.enqueue_counted(Request::new(p.clone(), params.clone()), tx);
            rx
        })
        .collect();
    run(&mut s, &mut f);
    let out = rxs
        .iter_mut()
        .map(|rx| {
            let (toks, done) = drain(rx);
            assert!(done.is_some(), "a request did not finish");
            toks
        })
        .collect();
    let snap = stats.snapshot();
    (out, snap.steps, snap)
}

fn markov(f: Fake, every: usize) -> Fake {
    Fake {
        markov: Some(every),
        ..f
    }
}

/// Four slots of 256 cells each (`unified`: one 1,024-cell cache shared by them): the
/// scheduler's configuration and a fake model laid out the same.
fn layout(unified: bool) -> (SchedulerConfig, Fake) {
    match unified {
        false => (SchedulerConfig::split(4, 256, 256), Fake::split(4, 256)),
        true => (SchedulerConfig::new(1024, 4, 256), Fake::new(1024)),
    }
}

fn prompts() -> Vec<Vec<i32>> {
    (0..4).map(|i| prompt(i, 24 + 8 * i as usize)).collect()
}

#[test]
fn greedy_output_is_identical_with_drafts_and_takes_fewer_steps() {
    for unified in [false, true] {
        let fake = || markov(layout(unified).1, 7);
        let params = SamplingParams::greedy(160);
        let (plain, plain_steps, p) =
            run_spec(layout(unified).0, fake(), false, &prompts(), &params);
        let (drafted, steps, d) = run_spec(layout(unified).0, fake(), true, &prompts(), &params);
        assert_eq!(
            plain, drafted,
            "drafts changed the output (unified: {unified})"
        );
        assert!(plain.iter().all(|t| t.len() == 160));
        assert_eq!(p.draft_tokens, 0);
        assert!(
            d.draft_accepted > 0 && d.draft_tokens > d.draft_accepted,
            "drafts accepted and rejected: {} of {}",
            d.draft_accepted,
            d.draft_tokens
        );
        assert!(
            steps < plain_steps,
            "{steps} steps with drafts, {plain_steps} without"
        );
    }
}

#[test]
fn a_draft_model_drafts_where_lookup_finds_nothing_and_leaves_the_output_as_it_is() {
    // the plain fake's output never repeats a 4-gram (prompt lookup finds little); its draft
    // model is right except every 4th token
    for unified in [false, true] {
        let cfg = || layout(unified).0;
        let fake = |model| Fake {
            draft_model: model,
            ..layout(unified).1
        };
        let params = SamplingParams::greedy(120);
        let (plain, plain_steps, _) = run_spec(cfg(), fake(None), false, &prompts(), &params);
        let (lookup, lookup_steps, l) = run_spec(cfg(), fake(None), true, &prompts(), &params);
        let (drafted, steps, d) = run_spec(cfg(), fake(Some(4)), true, &prompts(), &params);
        assert_eq!(plain, lookup);
        assert_eq!(
            plain, drafted,
            "the draft model changed the output (unified: {unified})"
        );
        assert_eq!(l.draft_model_tokens, 0);
        assert!(
            d.draft_model_accepted > 0 && d.draft_model_tokens > d.draft_model_accepted,
            "draft model tokens accepted and rejected: {} of {}",
            d.draft_model_accepted,
            d.draft_model_tokens
        );
        assert!(
            d.draft_model_tokens <= d.draft_tokens && d.draft_model_accepted <= d.draft_accepted
        );
        assert!(
            steps < lookup_steps && lookup_steps <= plain_steps,
            "{steps} steps with the draft model, {lookup_steps} with lookup alone, {plain_steps} without"
        );
    }
}

#[test]
fn seeded_sampling_draws_the_same_tokens_with_drafts() {
    let params = SamplingParams {
        temperature: 2.0,
        seed: Some(7),
        max_tokens: 120,
        ..Default::default()
    };
    let cfg = || SchedulerConfig::split(4, 256, 256);
    let (plain, _, _) = run_spec(
        cfg(),
        markov(Fake::split(4, 256), 7),
        false,
        &prompts(),
        &params,
    );
    let (drafted, _, d) = run_spec(
        cfg(),
        markov(Fake::split(4, 256), 7),
        true,
        &prompts(),
        &params,
    );
    assert_eq!(plain, drafted);
    assert!(d.draft_tokens > 0, "nothing drafted");
}

#[test]
fn a_sequence_whose_drafts_are_not_accepted_stops_drafting() {
    // every position breaks the pattern: a draft token is right 1 time in 6
    let cfg = || SchedulerConfig::split(2, 512, 512);
    let params = SamplingParams::greedy(400);
    let ps = vec![prompt(3, 20), prompt(5, 20)];
    let (plain, _, _) = run_spec(cfg(), markov(Fake::split(2, 512), 1), false, &ps, &params);
    let (drafted, _, d) = run_spec(cfg(), markov(Fake::split(2, 512), 1), true, &ps, &params);
    assert_eq!(plain, drafted);
    assert!(d.draft_tokens > 0, "it tried");
    assert!(
        d.draft_tokens * 10 < d.generated_tokens,
        "{} draft tokens ({} accepted) for {} generated",
        d.draft_tokens,
        d.draft_accepted,
        d.generated_tokens
    );
}

#[test]
fn drafts_stay_within_the_limit_and_the_slots_stream() {
    // a stream just larger than prompt + max_tokens, every draft accepted (the pattern never
    // breaks): the last steps' drafts must be cut to what is left
    let cfg = SchedulerConfig::split(1, 40, 40);
    let p = vec![prompt(1, 8)];
    for max in [1u32, 2, 5, 31] {
        let params = SamplingParams::greedy(max);
        let (plain, _, _) = run_spec(
            cfg.clone(),
            markov(Fake::split(1, 40), usize::MAX),
            false,
            &p,
            &params,
        );
        let (drafted, _, _) = run_spec(
            cfg.clone(),
            markov(Fake::split(1, 40), usize::MAX),
            true,
            &p,
            &params,
        );
        assert_eq!(plain, drafted);
        assert_eq!(drafted[0].len(), max as usize);
    }
}
