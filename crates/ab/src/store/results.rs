//! Results computed in the database: the statements aggregate exposures and events per variant
//! and metric (count, mean, sum of squared deviations, two passes for accuracy), so a results
//! call moves one row per variant × metric, whatever the traffic. The same SQL runs on SQLite
//! and PostgreSQL.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::experiment::Experiment;
use crate::stats::{from_moments, srm, welch_summaries, Comparison, SrmCheck, Summary};

/// Per unit its variant: the variant of its first non-forced exposure (lowest id).
const UNIT_VARIANT: &str = "
    first AS (SELECT unit, MIN(id) AS id FROM exposures WHERE experiment = $1 AND NOT forced GROUP BY unit),
    uv AS (SELECT first.unit, x.variant FROM first JOIN exposures x ON x.id = first.id)";

/// Units per variant.
pub(super) const UNITS: &str = "SELECT uv.variant, COUNT(*) FROM uv GROUP BY uv.variant";

/// Non-forced exposures per variant.
pub(super) const EXPOSURES: &str =
    "SELECT variant, COUNT(*) FROM exposures WHERE experiment = $1 AND NOT forced GROUP BY variant";

/// The values the moments are taken of: (variant, metric, v). Automatic metrics come from every
/// non-forced exposure; outcome metrics are one value per unit (the mean of its events),
/// attributed to the unit's variant; events of units never exposed are left out.
const VALUES: &str = "
    vals AS (
        SELECT variant, 'latency_ms' AS metric, latency_ms AS v FROM exposures
            WHERE experiment = $1 AND NOT forced AND latency_ms IS NOT NULL
        UNION ALL SELECT variant, 'ttft_ms', ttft_ms FROM exposures
            WHERE experiment = $1 AND NOT forced AND ttft_ms IS NOT NULL
        UNION ALL SELECT variant, 'output_tokens', CAST(output_tokens AS DOUBLE PRECISION) FROM exposures
            WHERE experiment = $1 AND NOT forced AND output_tokens IS NOT NULL
        UNION ALL SELECT variant, 'error', CASE WHEN error IS NULL THEN 0.0 ELSE 1.0 END FROM exposures
            WHERE experiment = $1 AND NOT forced
        UNION ALL SELECT uv.variant, e.metric, AVG(e.value) FROM events e JOIN uv ON uv.unit = e.unit
            WHERE e.experiment = $1 GROUP BY uv.variant, e.metric, e.unit
    ),
    m AS (SELECT variant, metric, AVG(v) AS mean FROM vals GROUP BY variant, metric)";

/// Per (variant, metric): n, mean, sum of squared deviations from the mean.
const MOMENTS: &str = "
    SELECT vals.variant, vals.metric, COUNT(*), MAX(m.mean), SUM((vals.v - m.mean) * (vals.v - m.mean))
    FROM vals JOIN m ON m.variant = vals.variant AND m.metric = vals.metric
    GROUP BY vals.variant, vals.metric";

pub(super) fn units_sql() -> String {
    format!("WITH {UNIT_VARIANT} {UNITS}")
}

pub(super) fn moments_sql() -> String {
    format!("WITH {UNIT_VARIANT}, {VALUES} {MOMENTS}")
}

/// One row of [`moments_sql`].
pub(super) type MomentRow = (String, String, i64, f64, f64);

#[derive(Debug, Clone, Serialize)]
pub struct MetricResult {
    pub summary: Summary,
    pub vs_control: Option<Comparison>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VariantResult {
    pub id: String,
    pub is_control: bool,
    pub units: u64,
    pub exposures: u64,
    pub metrics: BTreeMap<String, MetricResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Results {
    pub experiment: String,
    pub control: String,
    pub srm: Option<SrmCheck>,
    pub variants: Vec<VariantResult>,
}

/// Per-variant results with statistics against the control, from the aggregates.
pub(super) fn assemble(
    e: &Experiment,
    units: &BTreeMap<String, u64>,
    exposures: &BTreeMap<String, u64>,
    moments: Vec<MomentRow>,
) -> Results {
    let mut by_metric: BTreeMap<String, BTreeMap<String, Summary>> = BTreeMap::new();
    for (variant, metric, n, mean, m2) in moments {
        by_metric
            .entry(metric)
            .or_default()
            .insert(variant, from_moments(n as usize, mean, m2));
    }
    let control = &e.variants[e.control_index()].id;
    let empty = from_moments(0, f64::NAN, f64::NAN);
    let variants = e
        .variants
        .iter()
        .map(|v| {
            let metrics = by_metric
                .iter()
                .map(|(m, by_variant)| {
                    let xs = by_variant.get(&v.id).unwrap_or(&empty);
                    let cs = by_variant.get(control).unwrap_or(&empty);
                    let vs_control = if &v.id == control {
                        None
                    } else {
                        welch_summaries(cs, xs)
                    };
                    (
                        m.clone(),
                        MetricResult {
                            summary: *xs,
                            vs_control,
                        },
                    )
                })
                .collect();
            VariantResult {
                id: v.id.clone(),
                is_control: &v.id == control,
                units: units.get(&v.id).copied().unwrap_or(0),
                exposures: exposures.get(&v.id).copied().unwrap_or(0),
                metrics,
            }
        })
        .collect::<Vec<_>>();
    let observed: Vec<u64> = variants.iter().map(|v| v.units).collect();
    Results {
        experiment: e.name.clone(),
        control: control.clone(),
        srm: srm(&observed, &e.weights()),
        variants,
    }
}
