//! Metric definitions (`[[experiment.metrics]]`): how a unit's value of a metric is made from
//! its events or exposures, which direction is better, and where values are capped. A metric
//! without a definition keeps the default (the mean of the unit's values, higher is better).
//!
//! Per unit, by `aggregation` (GrowthBook's fact-metric aggregations):
//! - `sum`, `count`, `binary` (did the unit convert: 1 when one of its values is not 0, else 0;
//!   a value of 0 is a "no", as clients send for a thumbs-down or a false): every unit exposed
//!   by the cutoff counts, 0 where it has no value (as GrowthBook fills units without data);
//! - `mean`, `max`: only units with at least one value (a mean or maximum of nothing is
//!   undefined).
//!
//! `cap` winsorises at a percentile as GrowthBook's percentile capping does: the cap is the
//! percentile of the units' values pooled over every variant (linear interpolation, SQL's
//! `PERCENTILE_CONT`), and values above it become it. `direction = "lower"` makes chance to
//! beat control the chance to be lower and swaps the two risks (gbstats' `inverse`); the
//! dashboard calls a lower value the better one.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Aggregation {
    Sum,
    #[default]
    Mean,
    Count,
    Binary,
    Max,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    #[default]
    Higher,
    Lower,
}

/// One `[[experiment.metrics]]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricDef {
    pub name: String,
    #[serde(default)]
    pub aggregation: Aggregation,
    #[serde(default)]
    pub direction: Direction,
    /// Percentile in (0, 1) where unit values are capped (winsorised), e.g. 0.99.
    pub cap: Option<f64>,
    /// CUPED (`cuped.rs`): adjust with each unit's value of this metric from its events before
    /// its first exposure (GrowthBook's regression adjustment, off unless asked for, as there).
    /// The metric's values are then its events from the first exposure on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cuped: bool,
    /// Days before a unit's first exposure whose events make its pre-exposure value
    /// (default [`DEFAULT_LOOKBACK_DAYS`], as GrowthBook's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookback_days: Option<f64>,
}

/// What the store reads of one unit's values of a metric: their sum and maximum (`None`
/// without values), how many there are and how many of them are not 0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct UnitValues {
    pub sum: Option<f64>,
    pub count: i64,
    pub nonzero: i64,
    pub max: Option<f64>,
}

impl From<(Option<f64>, i64, i64, Option<f64>)> for UnitValues {
    /// From the store's columns: sum, count, count not 0, maximum.
    fn from((sum, count, nonzero, max): (Option<f64>, i64, i64, Option<f64>)) -> Self {
        UnitValues {
            sum,
            count,
            nonzero,
            max,
        }
    }
}

/// The CUPED lookback window when a definition names none: 14 days.
pub const DEFAULT_LOOKBACK_DAYS: f64 = 14.0;

/// Metrics made from exposures, not events: no unit has a value before its first exposure.
const AUTOMATIC: [&str; 6] = [
    "latency_ms",
    "ttft_ms",
    "output_tokens",
    "cost",
    "error",
    "grammar_complete",
];

impl MetricDef {
    /// A problem with the definition, if any.
    pub fn invalid(&self) -> Option<String> {
        if self.name.is_empty()
            || self.name.len() > 64
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Some(format!(
                "metric '{}': names must be 1-64 characters of letters, digits, '-', '_' or '.'",
                self.name
            ));
        }
        if let Some(p) = self.cap.filter(|p| !(*p > 0.0 && *p < 1.0)) {
            return Some(format!(
                "metric '{}': cap {p} must be a percentile between 0 and 1 (e.g. 0.99)",
                self.name
            ));
        }
        if let Some(d) = self.lookback_days.filter(|d| !(*d > 0.0 && d.is_finite())) {
            return Some(format!(
                "metric '{}': lookback_days {d} must be a positive number of days",
                self.name
            ));
        }
        if self.cuped && AUTOMATIC.contains(&self.name.as_str()) {
            return Some(format!(
                "metric '{}': cuped needs values from before a unit's first exposure, and an \
                 automatic metric has none (it is measured on exposures); use it with outcome \
                 events",
                self.name
            ));
        }
        None
    }

    /// The CUPED lookback window in seconds.
    pub fn lookback_seconds(&self) -> f64 {
        self.lookback_days.unwrap_or(DEFAULT_LOOKBACK_DAYS) * 86_400.0
    }

    /// The unit's value from what the store read of its values; `None` for a unit that does
    /// not count under this aggregation.
    pub fn unit_value(&self, u: UnitValues) -> Option<f64> {
        let UnitValues {
            sum,
            count,
            nonzero,
            max,
        } = u;
        match self.aggregation {
            Aggregation::Sum => Some(sum.unwrap_or(0.0)),
            Aggregation::Count => Some(count as f64),
            Aggregation::Binary => Some(if nonzero > 0 { 1.0 } else { 0.0 }),
            Aggregation::Mean => sum.filter(|_| count > 0).map(|s| s / count as f64),
            Aggregation::Max => max.filter(|_| count > 0),
        }
    }
}

/// Caps every variant's values at the `p` percentile of all of them; returns the cap (`None`
/// without values).
pub fn winsorise(by_variant: &mut [(String, Vec<f64>)], p: f64) -> Option<f64> {
    let all: Vec<f64> = by_variant
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    if all.is_empty() {
        return None;
    }
    // linear interpolation between order statistics: SQL's PERCENTILE_CONT, numpy's default
    let cap = crate::paired::quantile(&all, p);
    for (_, values) in by_variant.iter_mut() {
        for x in values.iter_mut() {
            *x = x.min(cap);
        }
    }
    Some(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_interpolate_as_percentile_cont_and_units_get_their_aggregate() {
        let mut v = vec![
            ("a".to_string(), vec![1.0, 2.0, 10.0]),
            ("b".to_string(), vec![3.0, 4.0]),
        ];
        assert!((winsorise(&mut v.clone(), 0.9).unwrap() - 7.6).abs() < 1e-12);
        assert_eq!(winsorise(&mut v.clone(), 1.0), Some(10.0));
        assert_eq!(winsorise(&mut v, 0.5), Some(3.0));
        assert_eq!(v[0].1, vec![1.0, 2.0, 3.0]);
        assert_eq!(winsorise(&mut vec![("a".to_string(), vec![])], 0.5), None);
        let def = |a| MetricDef {
            name: "m".into(),
            aggregation: a,
            direction: Direction::Higher,
            cap: None,
            cuped: false,
            lookback_days: None,
        };
        let none = UnitValues::default();
        // two values, 1 and 2
        let some = UnitValues {
            sum: Some(3.0),
            count: 2,
            nonzero: 2,
            max: Some(2.0),
        };
        // one value, 0: a "no"
        let no = UnitValues {
            sum: Some(0.0),
            count: 1,
            nonzero: 0,
            max: Some(0.0),
        };
        assert_eq!(def(Aggregation::Sum).unit_value(none), Some(0.0));
        assert_eq!(def(Aggregation::Binary).unit_value(some), Some(1.0));
        assert_eq!(def(Aggregation::Binary).unit_value(no), Some(0.0));
        assert_eq!(def(Aggregation::Binary).unit_value(none), Some(0.0));
        assert_eq!(def(Aggregation::Count).unit_value(no), Some(1.0));
        assert_eq!(def(Aggregation::Mean).unit_value(none), None);
        assert_eq!(def(Aggregation::Mean).unit_value(some), Some(1.5));
        assert_eq!(def(Aggregation::Max).unit_value(some), Some(2.0));
        assert_eq!(def(Aggregation::Count).unit_value(some), Some(2.0));
    }
}
