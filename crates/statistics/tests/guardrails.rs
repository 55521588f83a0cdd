//! The guardrail decision (`guardrail.rs`) in simulations with fixed seeds: units arrive one by
//! one, half to each arm, each with an error (1) or not (0); the decision is taken after every
//! 20 units up to 6,000 units.
//! - a treatment whose error rate is 3× control's (6% against 2%) is stopped in every run, and
//!   the test reports after how many units;
//! - an A/A treatment (2% both) is stopped in ≤ 5% of runs, however often the check looks.

use abserve_statistics::{harm, summarize, Direction, DEFAULT_TUNING};
use rand::{Rng, SeedableRng};

/// Units until the treatment is stopped (None: never within `max_units`).
fn run(
    rng: &mut rand_chacha::ChaCha8Rng,
    p_control: f64,
    p_treatment: f64,
    max_units: usize,
) -> Option<usize> {
    let (mut c, mut t) = (Vec::new(), Vec::new());
    for k in 1..=max_units {
        if k % 2 == 0 {
            c.push(if rng.gen_bool(p_control) { 1.0 } else { 0.0 });
        } else {
            t.push(if rng.gen_bool(p_treatment) { 1.0 } else { 0.0 });
        }
        if k % 20 == 0 {
            let h = harm(
                "error",
                &summarize(&c),
                &summarize(&t),
                Direction::Lower,
                0.0,
                0.05,
                DEFAULT_TUNING,
            );
            if h.is_some() {
                return Some(k);
            }
        }
    }
    None
}

#[test]
fn a_treatment_with_three_times_the_errors_is_stopped_and_a_harmless_one_rarely() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let runs = 300;
    let mut stops: Vec<usize> = (0..runs)
        .filter_map(|_| run(&mut rng, 0.02, 0.06, 6000))
        .collect();
    assert_eq!(
        stops.len(),
        runs,
        "every 3× treatment is stopped within 6000 units"
    );
    stops.sort();
    let (median, p95, max) = (stops[runs / 2], stops[runs * 95 / 100], stops[runs - 1]);
    eprintln!("3x error rate (2% vs 6%): stopped after a median of {median} units, 95% by {p95}, all by {max}");
    let aa = (0..runs)
        .filter(|_| run(&mut rng, 0.02, 0.02, 6000).is_some())
        .count();
    let rate = aa as f64 / runs as f64;
    eprintln!(
        "A/A (2% both): stopped in {aa} of {runs} runs ({:.1}%)",
        rate * 100.0
    );
    assert!(rate <= 0.05, "A/A stop rate {rate}");
    // a tolerated change of 200% (3× is +200%): the 3× treatment is not harmful beyond it
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let (c, t): (Vec<f64>, Vec<f64>) = (0..3000)
        .map(|_| {
            (
                if rng.gen_bool(0.02) { 1.0 } else { 0.0 },
                if rng.gen_bool(0.06) { 1.0 } else { 0.0 },
            )
        })
        .unzip();
    let (c, t) = (summarize(&c), summarize(&t));
    assert!(harm("error", &c, &t, Direction::Lower, 0.0, 0.05, DEFAULT_TUNING).is_some());
    assert!(harm("error", &c, &t, Direction::Lower, 2.5, 0.05, DEFAULT_TUNING).is_none());
    // higher is better: the same numbers are an improvement, never a harm
    assert!(harm(
        "error",
        &c,
        &t,
        Direction::Higher,
        0.0,
        0.05,
        DEFAULT_TUNING
    )
    .is_none());
}
