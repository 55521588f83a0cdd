//! Multi-armed bandits over an experiment's variants (`mode = "bandit"`, `decision_metric`,
//! `[experiment.bandit]`): the statistics. Thompson sampling moves traffic towards the arm most
//! likely to be best; estimates stay unbiased when weights change; a stopping rule names the
//! winner with the false-winner rate held at α. The server runs the updates (its `periodic.rs`;
//! `abserve_ab::next_bandit` computes them from the results' estimates) and keeps each unit on its first variant when the
//! weights change (sticky units); after a winner is named every unit gets it.
//!
//! **Periods.** Weights change only at updates; the units that arrive between two updates form
//! a period, with fixed weights, so within a period every arm is a random sample of the same
//! traffic. Pooling an arm's units over periods would weigh the periods by how much traffic the
//! arm got in each — the best arm's late periods count more for it than for the others, and a
//! drift in the traffic over time (weekday, a launch) then looks like an effect (Simpson's
//! paradox). As GrowthBook does, an arm's estimate is the mean of its per-period means, each
//! period weighed by its share of **all** units: every arm is estimated over the same mix of
//! periods (`estimates`). Its variance uses the arm's within-period variance, pooled.
//!
//! **Weights** (`weights`): until every arm has `exploration_units`, equal; then each arm's
//! chance of being best under the Gaussian posteriors of the estimates (computed by numerical
//! integration, not sampling, so an update is deterministic), with a floor per arm: weight =
//! floor + (1 − arms × floor) × chance.
//!
//! **Stopping** (`winner`): the leader (the best estimate by the metric's direction) is declared
//! the winner when the always-valid confidence sequence (`sequential.rs`) of its difference with
//! **every** other arm excludes 0 after Holm's adjustment across those comparisons; it may be
//! checked at every update, as often as wanted.

use serde::{Deserialize, Serialize};
use statrs::distribution::{Continuous, ContinuousCDF, Normal};

use crate::adjust::holm;
use crate::metric::Direction;
use crate::sequential::sequential;
use crate::stats::{from_moments, Summary};

/// One arm's units in one period: count, sum and sum of squares of their values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub n: u64,
    pub sum: f64,
    pub squares: f64,
}

impl Cell {
    pub fn add(&mut self, x: f64) {
        self.n += 1;
        self.sum += x;
        self.squares += x * x;
    }
}

/// An arm's period-weighted estimate: its mean, the variance of that mean, its units.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Estimate {
    #[schema(value_type = Option<f64>)]
    pub mean: f64,
    #[schema(value_type = Option<f64>)]
    pub variance: f64,
    pub units: u64,
}

impl Estimate {
    /// A summary with this mean whose `sd² / n` is the estimate's variance (what the tests of
    /// `stats.rs` and `sequential.rs` read).
    fn summary(&self) -> Summary {
        let n = self.units as usize;
        from_moments(
            n,
            self.mean,
            self.variance * self.units as f64 * (self.units as f64 - 1.0),
        )
    }
}

/// Every arm's estimate from `cells[period][arm]` (see the module doc).
pub fn estimates(cells: &[Vec<Cell>]) -> Vec<Estimate> {
    let arms = cells.first().map_or(0, Vec::len);
    let total: u64 = cells.iter().flatten().map(|c| c.n).sum();
    (0..arms)
        .map(|k| {
            let mut weight = 0.0;
            let (mut within, mut dof) = (0.0, 0.0);
            for period in cells {
                let c = period[k];
                if c.n > 0 {
                    weight += period.iter().map(|c| c.n).sum::<u64>() as f64 / total as f64;
                    within += c.squares - c.sum * c.sum / c.n as f64;
                    dof += c.n as f64 - 1.0;
                }
            }
            let s2 = if dof > 0.0 {
                within.max(0.0) / dof
            } else {
                f64::NAN
            };
            let (mut mean, mut spread) = (0.0, 0.0);
            for period in cells {
                let c = period[k];
                if c.n > 0 {
                    let w = period.iter().map(|c| c.n).sum::<u64>() as f64 / total as f64 / weight;
                    mean += w * c.sum / c.n as f64;
                    spread += w * w / c.n as f64;
                }
            }
            let units = cells.iter().map(|p| p[k].n).sum();
            if units == 0 {
                return Estimate {
                    mean: f64::NAN,
                    variance: f64::NAN,
                    units,
                };
            }
            Estimate {
                mean,
                variance: s2 * spread,
                units,
            }
        })
        .collect()
}

/// Each arm's chance of being the best (highest, or lowest where lower is better) when arm k's
/// mean is Normal(estimate, its variance): ∫ φ_k(x) Π_{j≠k} Φ_j(x) dx on a fine grid.
pub fn chance_best(est: &[Estimate], direction: Direction) -> Vec<f64> {
    let sign = if direction == Direction::Lower {
        -1.0
    } else {
        1.0
    };
    let arms: Vec<(f64, f64)> = est
        .iter()
        .map(|e| (sign * e.mean, e.variance.max(1e-18).sqrt()))
        .collect();
    if arms.iter().any(|(m, s)| !m.is_finite() || !s.is_finite()) {
        return vec![1.0 / est.len() as f64; est.len()];
    }
    let z = Normal::new(0.0, 1.0).expect("standard normal");
    let lo = arms
        .iter()
        .map(|(m, s)| m - 8.0 * s)
        .fold(f64::MAX, f64::min);
    let hi = arms
        .iter()
        .map(|(m, s)| m + 8.0 * s)
        .fold(f64::MIN, f64::max);
    let steps = 2000;
    let dx = (hi - lo) / steps as f64;
    let mut p = vec![0.0; arms.len()];
    for i in 0..=steps {
        let x = lo + i as f64 * dx;
        let w = if i == 0 || i == steps { 0.5 } else { 1.0 };
        let cdfs: Vec<f64> = arms.iter().map(|(m, s)| z.cdf((x - m) / s)).collect();
        for (k, (m, s)) in arms.iter().enumerate() {
            let density = z.pdf((x - m) / s) / s;
            if density == 0.0 {
                continue;
            }
            let others: f64 = (0..arms.len())
                .filter(|&j| j != k)
                .map(|j| cdfs[j])
                .product();
            p[k] += w * density * others * dx;
        }
    }
    let total: f64 = p.iter().sum();
    p.iter().map(|x| x / total).collect()
}

/// How a bandit moves its weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Units every arm gets before the weights move (equal weights until then).
    pub exploration_units: u64,
    /// The least weight an arm keeps, in [0, 1 / arms).
    pub floor: f64,
}

/// The weights for the next period (see the module doc).
pub fn weights(est: &[Estimate], direction: Direction, s: &Settings) -> Vec<f64> {
    let k = est.len() as f64;
    if est.iter().any(|e| e.units < s.exploration_units) {
        return vec![1.0 / k; est.len()];
    }
    let floor = s.floor.clamp(0.0, 1.0 / k);
    chance_best(est, direction)
        .into_iter()
        .map(|p| floor + (1.0 - k * floor) * p)
        .collect()
}

/// A bandit's winner: the arm, and its Holm-adjusted always-valid p-values against every other.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Winner {
    pub arm: usize,
    pub p_values: Vec<(usize, f64)>,
}

/// The winner, once the leader beats every other arm (see the module doc); `tuning` is the
/// sequential tuning parameter.
pub fn winner(est: &[Estimate], direction: Direction, alpha: f64, tuning: f64) -> Option<Winner> {
    let better = |a: f64, b: f64| match direction {
        Direction::Higher => a > b,
        Direction::Lower => a < b,
    };
    let mut leader = 0;
    for (k, e) in est.iter().enumerate() {
        if better(e.mean, est[leader].mean) {
            leader = k;
        }
    }
    let lead = est[leader].summary();
    let mut others = vec![];
    let mut raw = vec![];
    for (k, e) in est.iter().enumerate().filter(|(k, _)| *k != leader) {
        let s = sequential(&e.summary(), &lead, alpha, tuning)?;
        others.push(k);
        raw.push(s.p_value);
    }
    let adjusted = holm(&raw);
    if adjusted.iter().all(|p| *p < alpha) {
        return Some(Winner {
            arm: leader,
            p_values: others.into_iter().zip(adjusted).collect(),
        });
    }
    None
}

/// How an experiment's weights are set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The variants' weights, fixed.
    #[default]
    Fixed,
    /// Moved by the bandit at every update.
    Bandit,
}

impl Mode {
    pub fn is_fixed(&self) -> bool {
        *self == Mode::Fixed
    }
}

/// `[experiment.bandit]`: a bandit's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BanditSettings {
    /// Units every arm gets before the weights move (default 100).
    #[serde(default = "exploration")]
    pub exploration_units: u64,
    /// Seconds between updates of the weights (default 3600).
    #[serde(default = "hour")]
    pub update_seconds: f64,
    /// The least weight an arm keeps (default 0.01).
    #[serde(default = "one_percent")]
    pub floor: f64,
}

fn exploration() -> u64 {
    100
}
fn hour() -> f64 {
    3600.0
}
fn one_percent() -> f64 {
    0.01
}

impl Default for BanditSettings {
    fn default() -> Self {
        BanditSettings {
            exploration_units: exploration(),
            update_seconds: hour(),
            floor: one_percent(),
        }
    }
}

/// One period: from `start` (seconds since the epoch) the variants' weights were `weights`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Period {
    pub start: f64,
    pub weights: Vec<f64>,
}

/// What a bandit has done: its periods (the first starts at the first update) and, once named,
/// its winner.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BanditState {
    pub periods: Vec<Period>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub winner: Option<NamedWinner>,
}

/// The winner as stored: the variant, when, at how many units, the adjusted p-values against
/// the others (by variant id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NamedWinner {
    pub variant: String,
    pub at: f64,
    pub units: u64,
    pub p_values: Vec<(String, f64)>,
}

/// A bandit's read-out in `/results`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BanditResults {
    pub decision_metric: String,
    /// Periods so far (the units before the first update are one more).
    pub periods: usize,
    /// Per variant: the period-weighted estimate, its chance of being best, its weight now.
    pub arms: Vec<Arm>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub winner: Option<NamedWinner>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Arm {
    pub variant: String,
    #[serde(flatten)]
    pub estimate: Estimate,
    #[schema(value_type = Option<f64>)]
    pub chance_best: f64,
    #[schema(value_type = Option<f64>)]
    pub weight: f64,
    /// A secondary read-out: the arm's period-weighted mean `cost` per unit (answers of models
    /// with prices), estimated as the decision metric is; absent when the arm has no cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Estimate>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(xs: &[f64]) -> Cell {
        let mut c = Cell::default();
        for &x in xs {
            c.add(x);
        }
        c
    }

    #[test]
    fn one_period_is_the_plain_mean_and_periods_weigh_by_all_units() {
        let e = estimates(&[vec![cell(&[1.0, 3.0]), cell(&[2.0, 4.0, 6.0])]]);
        assert_eq!(e[0].mean, 2.0);
        assert!((e[1].variance - 4.0 / 3.0).abs() < 1e-12);
        // period 2 holds 3 of 5 units: arm 0 = 0.4 × 1 + 0.6 × 10
        let e = estimates(&[
            vec![cell(&[1.0]), cell(&[1.0])],
            vec![cell(&[10.0]), cell(&[10.0, 10.0])],
        ]);
        assert!((e[0].mean - 6.4).abs() < 1e-12 && (e[1].mean - 6.4).abs() < 1e-12);
    }

    #[test]
    fn chances_sum_to_one_and_follow_the_direction() {
        let est = |m: f64| Estimate {
            mean: m,
            variance: 0.01,
            units: 100,
        };
        let p = chance_best(&[est(1.0), est(1.0), est(1.5)], Direction::Higher);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!((p[0] - p[1]).abs() < 1e-9 && p[2] > 0.99);
        let p = chance_best(&[est(1.0), est(1.5)], Direction::Lower);
        assert!(p[0] > 0.99);
        let s = Settings {
            exploration_units: 100,
            floor: 0.05,
        };
        let w = weights(&[est(1.0), est(1.0), est(1.5)], Direction::Higher, &s);
        assert!((w[0] - 0.05).abs() < 1e-3 && (w.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }
}
