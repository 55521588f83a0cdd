//! Metric definitions (`[[experiment.metrics]]`): how a unit's value of a metric is made from
//! its events or exposures, which direction is better, and where values are capped. A metric
//! without a definition keeps the default (the mean of the unit's values, higher is better).
//!
//! Per unit, by `aggregation` (GrowthBook's fact-metric aggregations):
//! - `sum`, `count`, `binary` (did the unit have any value: 1 or 0): every unit exposed by the
//!   cutoff counts, 0 where it has no value (as GrowthBook fills units without data);
//! - `mean`, `max`: only units with at least one value (a mean or maximum of nothing is
//!   undefined).
//!
//! `cap` winsorises at a percentile as GrowthBook's percentile capping does: the cap is the
//! percentile of the units' values pooled over every variant (linear interpolation, SQL's
//! `PERCENTILE_CONT`), and values above it become it. `direction = "lower"` makes chance to
//! beat control the chance to be lower and swaps the two risks (gbstats' `inverse`); the
//! dashboard calls a lower value the better one.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregation {
    Sum,
    #[default]
    Mean,
    Count,
    Binary,
    Max,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    #[default]
    Higher,
    Lower,
}

/// One `[[experiment.metrics]]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricDef {
    pub name: String,
    #[serde(default)]
    pub aggregation: Aggregation,
    #[serde(default)]
    pub direction: Direction,
    /// Percentile in (0, 1) where unit values are capped (winsorised), e.g. 0.99.
    pub cap: Option<f64>,
}

impl MetricDef {
    /// A problem with the definition, if any.
    pub(crate) fn invalid(&self) -> Option<String> {
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
        match self.cap {
            Some(p) if !(p > 0.0 && p < 1.0) => Some(format!(
                "metric '{}': cap {p} must be a percentile between 0 and 1 (e.g. 0.99)",
                self.name
            )),
            _ => None,
        }
    }

    /// The unit's value from the sum, count and maximum of its values (`None`: it has none);
    /// `None` for a unit that does not count under this aggregation.
    pub(crate) fn unit_value(&self, sum: Option<f64>, count: i64, max: Option<f64>) -> Option<f64> {
        match self.aggregation {
            Aggregation::Sum => Some(sum.unwrap_or(0.0)),
            Aggregation::Count => Some(count as f64),
            Aggregation::Binary => Some(if count > 0 { 1.0 } else { 0.0 }),
            Aggregation::Mean => sum.filter(|_| count > 0).map(|s| s / count as f64),
            Aggregation::Max => max.filter(|_| count > 0),
        }
    }
}

/// Caps every variant's values at the `p` percentile of all of them; returns the cap (`None`
/// without values).
pub(crate) fn winsorise(by_variant: &mut [(String, Vec<f64>)], p: f64) -> Option<f64> {
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
        };
        assert_eq!(def(Aggregation::Sum).unit_value(None, 0, None), Some(0.0));
        assert_eq!(
            def(Aggregation::Binary).unit_value(Some(3.0), 2, Some(2.0)),
            Some(1.0)
        );
        assert_eq!(def(Aggregation::Mean).unit_value(None, 0, None), None);
        assert_eq!(
            def(Aggregation::Mean).unit_value(Some(3.0), 2, Some(2.0)),
            Some(1.5)
        );
        assert_eq!(
            def(Aggregation::Max).unit_value(Some(3.0), 2, Some(2.0)),
            Some(2.0)
        );
        assert_eq!(
            def(Aggregation::Count).unit_value(Some(3.0), 2, Some(2.0)),
            Some(2.0)
        );
    }
}
