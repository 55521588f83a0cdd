//! Calibration under peeking: experiments watched after every 50 units up to 2,000 units, over
//! many seeded runs, and stopped at the first look that calls a difference.
//!
//! - A/A (no effect): the always-valid sequence calls a difference in ≤ 5% of runs, while the
//!   fixed-horizon Welch test checked the same way calls one in far more than 5%;
//! - a known effect: the sequence covers the true difference at every look in ≥ 95% of runs,
//!   and the power of both (the share of runs that call it by 2,000 units) is printed.

use abserve_statistics::{from_moments, sequential, welch_summaries, Summary, DEFAULT_TUNING};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal, Normal};

const RUNS: usize = 1000;
const LOOK_EVERY: usize = 50;
const UNITS: usize = 2000;

/// Welford's running mean and sum of squared deviations.
#[derive(Default)]
struct Running {
    n: usize,
    mean: f64,
    m2: f64,
}

impl Running {
    fn push(&mut self, x: f64) {
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
    }
    fn summary(&self) -> Summary {
        from_moments(self.n, self.mean, self.m2)
    }
}

struct Outcome {
    /// the fixed-horizon test had p < 0.05 at some look
    fixed_called: bool,
    /// the sequence excluded 0 at some look
    sequential_called: bool,
    /// the sequence held the true difference at every look
    covered: bool,
}

/// One experiment: units split 50/50 at random, values from `dist` (+ `effect` for treatment).
fn run(seed: u64, dist: &impl Distribution<f64>, effect: f64) -> Outcome {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (mut c, mut t) = (Running::default(), Running::default());
    let mut out = Outcome {
        fixed_called: false,
        sequential_called: false,
        covered: true,
    };
    for unit in 1..=UNITS {
        if rng.gen_bool(0.5) {
            t.push(dist.sample(&mut rng) + effect);
        } else {
            c.push(dist.sample(&mut rng));
        }
        if unit % LOOK_EVERY == 0 {
            let (cs, ts) = (c.summary(), t.summary());
            if let Some(w) = welch_summaries(&cs, &ts) {
                out.fixed_called |= w.p_value < 0.05;
            }
            if let Some(s) = sequential(&cs, &ts, 0.05, DEFAULT_TUNING) {
                out.sequential_called |= s.ci_low > 0.0 || s.ci_high < 0.0;
                out.covered &= s.ci_low <= effect && effect <= s.ci_high;
                // the always-valid p-value says the same as the interval
                assert_eq!(
                    s.p_value < 0.05,
                    s.ci_low > 0.0 || s.ci_high < 0.0,
                    "p {} vs [{}, {}]",
                    s.p_value,
                    s.ci_low,
                    s.ci_high
                );
            }
        }
    }
    out
}

fn rates(dist: &impl Distribution<f64>, effect: f64, seed: u64) -> (f64, f64, f64) {
    let outcomes: Vec<Outcome> = (0..RUNS as u64)
        .map(|i| run(seed + i, dist, effect))
        .collect();
    let share = |f: &dyn Fn(&Outcome) -> bool| {
        outcomes.iter().filter(|o| f(o)).count() as f64 / RUNS as f64
    };
    (
        share(&|o| o.fixed_called),
        share(&|o| o.sequential_called),
        share(&|o| o.covered),
    )
}

#[test]
fn peeking_at_an_aa_test_keeps_the_sequential_false_positive_rate_under_alpha() {
    for (what, (fixed, seq, _)) in [
        (
            "normal latency-like values",
            rates(&Normal::new(10.0, 3.0).unwrap(), 0.0, 1_000),
        ),
        (
            "skewed (log-normal) token counts",
            rates(&LogNormal::new(4.0, 0.8).unwrap(), 0.0, 50_000),
        ),
    ] {
        println!(
            "A/A, {what}, {} looks: fixed-horizon false positives {:.1}%, sequential {:.1}%",
            UNITS / LOOK_EVERY,
            fixed * 100.0,
            seq * 100.0
        );
        assert!(
            seq <= 0.05,
            "{what}: sequential false-positive rate {seq} > 5% under peeking"
        );
        assert!(
            fixed > 0.05,
            "{what}: fixed-horizon false-positive rate {fixed} should exceed 5% under peeking"
        );
    }
}

#[test]
fn a_known_effect_is_covered_at_every_look_and_its_power_is_reported() {
    let effect = 0.6;
    let (fixed, seq, covered) = rates(&Normal::new(10.0, 3.0).unwrap(), effect, 9_000);
    println!(
        "effect {effect} (sd 3), {UNITS} units, a look every {LOOK_EVERY}: power fixed-horizon (peeking) {:.1}%, sequential {:.1}%; \
         sequence covered the effect at every look in {:.1}% of runs",
        fixed * 100.0,
        seq * 100.0,
        covered * 100.0
    );
    assert!(
        covered >= 0.95,
        "the sequence missed the true effect at some look in {:.1}% of runs",
        (1.0 - covered) * 100.0
    );
    assert!(
        seq > 0.5,
        "sequential power {seq} for a {effect} effect over {UNITS} units"
    );
}
