//! The per-unit values of a metric defined with `cuped = true`: its post-exposure value (events
//! from the unit's first exposure on) and its pre-exposure value (events in the lookback window
//! before it), made by the definition's aggregation, capped as the definition says (the post
//! and the pre values each at their own pooled percentile, as GrowthBook caps the covariate
//! separately). A unit without pre-exposure events has 0 (GrowthBook fills it so); a unit
//! without a post value under `mean` or `max` does not count, as without CUPED.

use std::collections::BTreeMap;

use abserve_statistics::PrePost;
use abserve_statistics::Summary;
use abserve_statistics::{winsorise, Aggregation, MetricDef};

/// Per unit exposed by the cutoff `$2`: its variant and, of metric `$3`, the sum, count, count
/// not 0 and maximum of its events from its first exposure on, and of those in the `$4` seconds
/// before.
pub(super) fn pre_post_sql() -> String {
    let nz = super::nonzero("value");
    format!(
        "WITH first AS (SELECT unit, MIN(id) AS id FROM exposures WHERE experiment = $1 AND NOT forced AND ts <= $2 GROUP BY unit),
    uv AS (SELECT first.unit, x.variant, x.ts AS t0 FROM first JOIN exposures x ON x.id = first.id),
    ev AS (SELECT e.unit, e.value, e.ts, uv.t0 FROM events e JOIN uv ON uv.unit = e.unit
        WHERE e.experiment = $1 AND e.metric = $3),
    post AS (SELECT unit, SUM(value) AS s, COUNT(*) AS c, {nz} AS nz, MAX(value) AS mx FROM ev
        WHERE ts >= t0 GROUP BY unit),
    pre AS (SELECT unit, SUM(value) AS s, COUNT(*) AS c, {nz} AS nz, MAX(value) AS mx FROM ev
        WHERE ts < t0 AND ts >= t0 - $4 GROUP BY unit)
    SELECT uv.variant, post.s, COALESCE(post.c, 0), COALESCE(post.nz, 0), post.mx,
        pre.s, COALESCE(pre.c, 0), COALESCE(pre.nz, 0), pre.mx
    FROM uv LEFT JOIN post ON post.unit = uv.unit LEFT JOIN pre ON pre.unit = uv.unit"
    )
}

/// One row of [`pre_post_sql`]: the variant, then the post and the pre values' sum, count,
/// count not 0 and maximum.
pub(super) type PrePostRow = (
    String,
    Option<f64>,
    i64,
    i64,
    Option<f64>,
    Option<f64>,
    i64,
    i64,
    Option<f64>,
);

/// A CUPED metric's per-variant post summaries, the cap applied to post values, and the
/// per-variant sums of (pre, post).
pub(super) fn pre_post(
    def: &MetricDef,
    rows: Vec<PrePostRow>,
) -> (
    BTreeMap<String, Summary>,
    Option<f64>,
    BTreeMap<String, PrePost>,
) {
    let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (variant, s, c, nz, mx, ps, pc, pnz, pmx) in rows {
        let units = by.entry(variant).or_default();
        if let Some(y) = def.unit_value((s, c, nz, mx).into()) {
            let x = def.unit_value((ps, pc, pnz, pmx).into());
            units.push((x.unwrap_or(0.0), y));
        }
    }
    let mut cap = None;
    if let Some(p) = def.cap {
        let split = |k: usize| -> Vec<(String, Vec<f64>)> {
            by.iter()
                .map(|(v, u)| (v.clone(), u.iter().map(|xy| [xy.0, xy.1][k]).collect()))
                .collect()
        };
        let (mut pre, mut post) = (split(0), split(1));
        winsorise(&mut pre, p);
        cap = winsorise(&mut post, p);
        for ((units, (_, xs)), (_, ys)) in by.values_mut().zip(pre).zip(post) {
            *units = xs.into_iter().zip(ys).collect();
        }
    }
    let binary = def.aggregation == Aggregation::Binary;
    let mut summaries = BTreeMap::new();
    let mut sums = BTreeMap::new();
    for (v, units) in by {
        let ys: Vec<f64> = units.iter().map(|u| u.1).collect();
        summaries.insert(v.clone(), super::results::unit_summary(&ys, binary));
        sums.insert(v, PrePost::of(&units, binary));
    }
    (summaries, cap, sums)
}
