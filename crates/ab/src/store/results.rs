//! Results computed in the database: the statements aggregate exposures and events per variant
//! and metric (count, mean, sum of squared deviations, two passes for accuracy), so a results
//! call moves one row per variant × metric, whatever the traffic. The same SQL runs on SQLite
//! and PostgreSQL.
//!
//! Every statement takes a time cutoff (`$2`, seconds since the epoch): exposures recorded after
//! it are left out, so only the units that had arrived by then count, each with every outcome
//! event known for it now (events usually come after the exposure). That gives the results over
//! the first k units, the history behind the dashboard's chart; `f64::MAX` for all of them.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::experiment::Experiment;
use abserve_statistics::RatioMoments;
use abserve_statistics::{bayesian, Bayesian};
use abserve_statistics::{benjamini_hochberg, holm};
use abserve_statistics::{
    from_moments, srm, welch_summaries, Comparison, SrmCheck, Summary, ALPHA,
};
use abserve_statistics::{sequential, Sequential, DEFAULT_TUNING};
use abserve_statistics::{Direction, MetricDef};

use super::nonzero;

/// Per unit its variant: the variant of its first non-forced exposure (lowest id).
const UNIT_VARIANT: &str = "
    first AS (SELECT unit, MIN(id) AS id FROM exposures WHERE experiment = $1 AND NOT forced AND ts <= $2 GROUP BY unit),
    uv AS (SELECT first.unit, x.variant FROM first JOIN exposures x ON x.id = first.id)";

/// Units per variant.
pub(super) const UNITS: &str = "SELECT uv.variant, COUNT(*) FROM uv GROUP BY uv.variant";

/// Non-forced exposures per variant.
pub(super) const EXPOSURES: &str =
    "SELECT variant, COUNT(*) FROM exposures WHERE experiment = $1 AND NOT forced AND ts <= $2 GROUP BY variant";

/// The automatic metrics of every non-forced exposure recorded by `$2`, as (KEY, metric, v)
/// rows; KEY is `variant` or `unit`.
const AUTOMATIC: &str = "
        SELECT KEY, 'latency_ms' AS metric, latency_ms AS v FROM exposures
            WHERE experiment = $1 AND NOT forced AND ts <= $2 AND latency_ms IS NOT NULL
        UNION ALL SELECT KEY, 'ttft_ms', ttft_ms FROM exposures
            WHERE experiment = $1 AND NOT forced AND ts <= $2 AND ttft_ms IS NOT NULL
        UNION ALL SELECT KEY, 'output_tokens', CAST(output_tokens AS DOUBLE PRECISION) FROM exposures
            WHERE experiment = $1 AND NOT forced AND ts <= $2 AND output_tokens IS NOT NULL
        UNION ALL SELECT KEY, 'cost', cost FROM exposures
            WHERE experiment = $1 AND NOT forced AND ts <= $2 AND cost IS NOT NULL
        UNION ALL SELECT KEY, 'error', CASE WHEN error IS NULL THEN 0.0 ELSE 1.0 END FROM exposures
            WHERE experiment = $1 AND NOT forced AND ts <= $2
        UNION ALL SELECT KEY, 'grammar_complete', CASE WHEN grammar_complete THEN 1.0 ELSE 0.0 END FROM exposures
            WHERE experiment = $1 AND NOT forced AND ts <= $2 AND constrained AND error IS NULL";

/// What one observation of a metric is: a unit (the default) or a request.
///
/// Units are what is randomised: the requests of one user are correlated, so treating them as
/// independent observations underestimates the variance, and the false-positive rate grows with
/// requests per unit (`tests/per_unit.rs` measures it). Per unit, each automatic metric is the
/// **mean over the unit's exposures** (GrowthBook's and Statsig's default for a mean metric: one
/// value per user, each user weighs the same), attributed to the unit's variant (that of its
/// first exposure). The per-request view (every exposure one observation) stays available,
/// labelled as such; outcome metrics are one value per unit in both.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Analysis {
    #[default]
    Unit,
    Request,
}

/// The values the moments are taken of: (variant, metric, v). Automatic metrics per `analysis`
/// (a unit's mean over its non-forced exposures, or every exposure); outcome metrics are one
/// value per unit (the mean of its events), attributed to the unit's variant; events of units
/// never exposed are left out.
fn values(analysis: Analysis) -> String {
    let automatic = match analysis {
        Analysis::Request => AUTOMATIC.replace("KEY", "variant"),
        Analysis::Unit => format!(
            "SELECT uv.variant, a.metric, AVG(a.v) AS v FROM ({}) a JOIN uv ON uv.unit = a.unit
            GROUP BY uv.variant, a.metric, a.unit",
            AUTOMATIC.replace("KEY", "unit")
        ),
    };
    format!(
        "vals AS ({automatic}
        UNION ALL SELECT uv.variant, e.metric, AVG(e.value) FROM events e JOIN uv ON uv.unit = e.unit
            WHERE e.experiment = $1 GROUP BY uv.variant, e.metric, e.unit
    ),
    m AS (SELECT variant, metric, AVG(v) AS mean FROM vals GROUP BY variant, metric)"
    )
}

/// Per (variant, metric): n, mean, sum of squared deviations from the mean.
const MOMENTS: &str = "
    SELECT vals.variant, vals.metric, COUNT(*), MAX(m.mean), SUM((vals.v - m.mean) * (vals.v - m.mean))
    FROM vals JOIN m ON m.variant = vals.variant AND m.metric = vals.metric
    GROUP BY vals.variant, vals.metric";

/// Per unit and metric the sum of its values (automatic metrics over the unit's exposures,
/// outcome metrics over its events), for the two metrics of a ratio (`$3` / `$4`); per variant
/// the units' numerators and denominators (0 where a unit has none) in two passes.
fn ratio() -> String {
    format!(
        "unit_vals AS ({}
        UNION ALL SELECT unit, metric, value FROM events WHERE experiment = $1
    ),
    sums AS (SELECT unit, metric, SUM(v) AS s FROM unit_vals WHERE metric = $3 OR metric = $4 GROUP BY unit, metric),
    pu AS (SELECT uv.variant, COALESCE(a.s, 0.0) AS x, COALESCE(b.s, 0.0) AS y FROM uv
        LEFT JOIN sums a ON a.unit = uv.unit AND a.metric = $3
        LEFT JOIN sums b ON b.unit = uv.unit AND b.metric = $4),
    mu AS (SELECT variant, AVG(x) AS mx, AVG(y) AS my FROM pu GROUP BY variant)
    SELECT pu.variant, COUNT(*), MAX(mu.mx), MAX(mu.my), SUM((pu.x - mu.mx) * (pu.x - mu.mx)),
        SUM((pu.y - mu.my) * (pu.y - mu.my)), SUM((pu.x - mu.mx) * (pu.y - mu.my))
    FROM pu JOIN mu ON mu.variant = pu.variant GROUP BY pu.variant",
        AUTOMATIC.replace("KEY", "unit")
    )
}

/// Per unit of the experiment (exposed by the cutoff) its variant and, of metric `$3`, the
/// sum, count, count of values not 0, and maximum of its values (automatic metrics over its
/// non-forced exposures, outcome metrics over its events); a unit without a value has a NULL
/// sum and counts of 0.
/// A defined metric (`metric.rs`) makes each unit's value from them in Rust.
fn defined() -> String {
    format!(
        "unit_vals AS ({}
        UNION ALL SELECT unit, metric, value FROM events WHERE experiment = $1
    ),
    per AS (SELECT unit, SUM(v) AS s, COUNT(*) AS c, {NONZERO_V} AS nz, MAX(v) AS mx FROM unit_vals
        WHERE metric = $3 GROUP BY unit)
    SELECT uv.variant, per.s, COALESCE(per.c, 0), COALESCE(per.nz, 0), per.mx FROM uv LEFT JOIN per ON per.unit = uv.unit",
        AUTOMATIC.replace("KEY", "unit"),
        NONZERO_V = nonzero("v"),
    )
}

pub(super) fn defined_sql() -> String {
    format!("WITH {UNIT_VARIANT}, {}", defined())
}

/// One row of [`defined_sql`]: variant, sum, count, count not 0, maximum.
pub(super) type DefinedRow = (String, Option<f64>, i64, i64, Option<f64>);

/// A defined metric's per-unit values by variant, capped when it says so: its summaries and
/// the cap applied.
pub(super) fn defined_summaries(
    def: &MetricDef,
    rows: Vec<DefinedRow>,
) -> (BTreeMap<String, Summary>, Option<f64>) {
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (variant, sum, count, nonzero, max) in rows {
        let entry = by.entry(variant).or_default();
        if let Some(x) = def.unit_value((sum, count, nonzero, max).into()) {
            entry.push(x);
        }
    }
    let mut by: Vec<(String, Vec<f64>)> = by.into_iter().collect();
    let cap = def
        .cap
        .and_then(|p| abserve_statistics::winsorise(&mut by, p));
    let binary = def.aggregation == abserve_statistics::Aggregation::Binary;
    let summaries = by
        .into_iter()
        .map(|(v, xs)| (v, unit_summary(&xs, binary)))
        .collect();
    (summaries, cap)
}

/// The summary of units' values; a `binary` metric's variance is p(1 − p), as GrowthBook's
/// `ProportionStatistic`.
pub(super) fn unit_summary(xs: &[f64], binary: bool) -> Summary {
    let s = abserve_statistics::summarize(xs);
    if binary && s.n > 0 {
        return from_moments(s.n, s.mean, s.mean * (1.0 - s.mean) * (s.n as f64 - 1.0));
    }
    s
}

/// Every `$3`-th unit's arrival (the time of its first non-forced exposure) and the last one's:
/// the points of the results' history.
pub(super) const ARRIVALS: &str = "
    WITH f AS (SELECT unit, MIN(ts) AS t FROM exposures WHERE experiment = $1 AND NOT forced AND ts <= $2 GROUP BY unit),
    r AS (SELECT t, ROW_NUMBER() OVER (ORDER BY t, unit) AS k FROM f)
    SELECT k, t FROM r WHERE k % $3 = 0 OR k = (SELECT COUNT(*) FROM f) ORDER BY k";

pub(super) fn ratio_sql() -> String {
    format!("WITH {UNIT_VARIANT}, {}", ratio())
}

/// One row of [`ratio_sql`].
pub(super) type RatioRow = (String, i64, f64, f64, f64, f64, f64);

pub(super) fn ratio_moments(row: &RatioRow) -> RatioMoments {
    let (_, n, mx, my, m2x, m2y, cxy) = *row;
    RatioMoments {
        n: n as usize,
        numerator_mean: mx,
        denominator_mean: my,
        numerator_m2: m2x,
        denominator_m2: m2y,
        co_moment: cxy,
    }
}

pub(super) fn units_sql() -> String {
    format!("WITH {UNIT_VARIANT} {UNITS}")
}

pub(super) fn moments_sql(analysis: Analysis) -> String {
    format!("WITH {UNIT_VARIANT}, {} {MOMENTS}", values(analysis))
}

/// One row of [`moments_sql`].
pub(super) type MomentRow = (String, String, i64, f64, f64);

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct MetricResult {
    pub summary: Summary,
    /// Fixed-horizon Welch's t-test against control (valid once, at a planned sample size).
    pub vs_control: Option<Comparison>,
    /// Always-valid confidence sequence against control (valid at every look).
    pub sequential: Option<Sequential>,
    /// GrowthBook's Bayesian read-out: chance to beat control, relative uplift, risk.
    pub bayesian: Option<Bayesian>,
    /// p-values adjusted across all comparisons of the experiment (when there is more than one).
    pub adjusted: Option<Adjusted>,
    /// For a ratio metric: its definition and the per-unit means of numerator and denominator.
    pub ratio: Option<RatioParts>,
    /// The metric's definition, when the experiment has one (`[[experiment.metrics]]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub definition: Option<MetricDef>,
    /// The value units were capped at (the definition's percentile of all units' values).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap_value: Option<f64>,
    /// For a treatment on a metric defined with `cuped = true`: the regression-adjusted read-out
    /// beside the unadjusted one above, with the variance reduction achieved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuped: Option<abserve_statistics::Cuped>,
}

#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct Adjusted {
    /// Welch's p-value, Holm–Bonferroni adjusted (family-wise error rate).
    #[schema(value_type = Option<f64>)]
    pub holm: f64,
    /// Welch's p-value, Benjamini–Hochberg adjusted (false discovery rate).
    #[schema(value_type = Option<f64>)]
    pub bh: f64,
    /// The always-valid p-value, Holm–Bonferroni adjusted.
    #[schema(value_type = Option<f64>)]
    pub sequential_holm: f64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RatioParts {
    pub numerator: String,
    pub denominator: String,
    #[schema(value_type = Option<f64>)]
    pub numerator_mean: f64,
    #[schema(value_type = Option<f64>)]
    pub denominator_mean: f64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct VariantResult {
    pub id: String,
    /// The LoRA adapters the variant generates with (none: the base model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adapters: Option<Vec<abserve_protocol::Adapter>>,
    /// The model the variant generates with (none: the server's default model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub is_control: bool,
    /// `active`, or `stopped` by a guardrail (then `stopped` has the evidence).
    pub state: VariantState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<abserve_statistics::Harm>,
    #[schema(value_type = Option<f64>)]
    pub weight: f64,
    pub units: u64,
    pub exposures: u64,
    pub metrics: BTreeMap<String, MetricResult>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum VariantState {
    Active,
    Stopped,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Results {
    pub experiment: String,
    /// What one observation is (`unit`, the default, or `request`; see [`Analysis`]).
    pub analysis: Analysis,
    pub control: String,
    #[schema(value_type = Option<f64>)]
    pub alpha: f64,
    /// The sequential tuning parameter in use (total units where the sequence is tightest).
    #[schema(value_type = Option<f64>)]
    pub sequential_tuning: f64,
    /// How many variant × metric comparisons with control were made (the family adjusted).
    pub comparisons: usize,
    pub srm: Option<SrmCheck>,
    pub variants: Vec<VariantResult>,
    /// A bandit's estimates, chances, weights and winner (`mode = "bandit"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bandit: Option<abserve_statistics::bandit::BanditResults>,
}

/// One point of an experiment's history: the results over the first `units` units (those that
/// had arrived by `at`), with every event known for them.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryPoint {
    pub units: u64,
    /// Seconds since the Unix epoch.
    pub at: f64,
    pub results: Results,
}

/// A defined metric: per variant its summary, the cap applied, and with CUPED per variant the
/// sums of its units' (pre, post) values.
pub(super) struct Defined {
    /// Its index in `e.metrics`.
    pub index: usize,
    pub summaries: BTreeMap<String, Summary>,
    pub cap: Option<f64>,
    pub pre_post: Option<BTreeMap<String, abserve_statistics::PrePost>>,
}

/// Every metric's summary per variant: the automatic and outcome metrics from their moments,
/// the ratio metrics from their per-unit sums (with their parts).
type ByMetric = BTreeMap<String, BTreeMap<String, (Summary, Option<RatioParts>)>>;

fn by_metric(
    e: &Experiment,
    moments: Vec<MomentRow>,
    ratios: Vec<(usize, Vec<RatioRow>)>,
    defined: &[Defined],
) -> ByMetric {
    let mut by_metric: ByMetric = BTreeMap::new();
    for (variant, metric, n, mean, m2) in moments {
        by_metric
            .entry(metric)
            .or_default()
            .insert(variant, (from_moments(n as usize, mean, m2), None));
    }
    // a defined metric's per-unit summaries replace the default ones
    for d in defined {
        let entry = by_metric
            .entry(e.metrics[d.index].name.clone())
            .or_default();
        entry.clear();
        for (variant, s) in &d.summaries {
            entry.insert(variant.clone(), (*s, None));
        }
    }
    for (i, rows) in ratios {
        let def = &e.ratios[i];
        let entry = by_metric.entry(def.name.clone()).or_default();
        for row in rows {
            let m = ratio_moments(&row);
            let parts = RatioParts {
                numerator: def.numerator.clone(),
                denominator: def.denominator.clone(),
                numerator_mean: m.numerator_mean,
                denominator_mean: m.denominator_mean,
            };
            entry.insert(row.0.clone(), (m.summary(), Some(parts)));
        }
    }
    by_metric
}

/// One variant's result on one metric: its summary and, for a treatment, the tests against
/// control (Welch, sequential, Bayesian; adjusted later across comparisons).
fn metric_result(
    cs: &Summary,
    xs: &Summary,
    ratio: &Option<RatioParts>,
    treated: bool,
    tuning: f64,
) -> MetricResult {
    MetricResult {
        summary: *xs,
        vs_control: treated.then(|| welch_summaries(cs, xs)).flatten(),
        sequential: treated.then(|| sequential(cs, xs, ALPHA, tuning)).flatten(),
        bayesian: treated.then(|| bayesian(cs, xs, ALPHA)).flatten(),
        adjusted: None,
        ratio: ratio.clone(),
        definition: None,
        cap_value: None,
        cuped: None,
    }
}

/// Lays a metric's definition over its result: the CUPED read-out of treatment `variant`
/// against `control` where asked for; where lower is better, chance to beat control is the
/// chance to be lower and the two risks swap (gbstats' `inverse`).
fn defined_result(
    mut r: MetricResult,
    def: &MetricDef,
    d: &Defined,
    (control, variant): (&str, &str),
    tuning: f64,
) -> MetricResult {
    if let Some(sums) = &d.pre_post {
        if control != variant {
            if let (Some(c), Some(t)) = (sums.get(control), sums.get(variant)) {
                r.cuped = abserve_statistics::cuped(c, t, ALPHA, tuning);
            }
        }
    }
    if def.direction == Direction::Lower {
        let cuped = r.cuped.as_mut().and_then(|c| c.bayesian.as_mut());
        for b in r.bayesian.as_mut().into_iter().chain(cuped) {
            b.chance_to_beat_control = 1.0 - b.chance_to_beat_control;
            std::mem::swap(&mut b.risk_control, &mut b.risk_treatment);
        }
    }
    r.definition = Some(def.clone());
    r.cap_value = d.cap;
    r
}

/// Per-variant results with statistics against the control, from the aggregates.
pub(super) fn assemble(
    e: &Experiment,
    analysis: Analysis,
    units: &BTreeMap<String, u64>,
    exposures: &BTreeMap<String, u64>,
    moments: Vec<MomentRow>,
    ratios: Vec<(usize, Vec<RatioRow>)>,
    defined: Vec<Defined>,
) -> Results {
    let by_metric = by_metric(e, moments, ratios, &defined);
    let definition = |m: &str| {
        defined
            .iter()
            .find(|d| e.metrics[d.index].name == m)
            .map(|d| (&e.metrics[d.index], d))
    };
    let control = &e.variants[e.control_index()].id;
    let tuning = e.sequential_tuning.unwrap_or(DEFAULT_TUNING);
    let empty = (from_moments(0, f64::NAN, f64::NAN), None);
    let weights = e.weights();
    let mut variants = e
        .variants
        .iter()
        .zip(&weights)
        .map(|(v, &weight)| {
            let metrics = by_metric
                .iter()
                .map(|(m, by_variant)| {
                    let (xs, ratio) = by_variant.get(&v.id).unwrap_or(&empty);
                    let (cs, _) = by_variant.get(control).unwrap_or(&empty);
                    let mut result = metric_result(cs, xs, ratio, &v.id != control, tuning);
                    if let Some((def, d)) = definition(m) {
                        result = defined_result(result, def, d, (control, &v.id), tuning);
                    }
                    (m.clone(), result)
                })
                .collect();
            VariantResult {
                id: v.id.clone(),
                adapters: v.adapters.clone(),
                model: v.model.clone(),
                is_control: &v.id == control,
                state: if v.stopped.is_some() {
                    VariantState::Stopped
                } else {
                    VariantState::Active
                },
                stopped: v.stopped.clone(),
                weight,
                units: units.get(&v.id).copied().unwrap_or(0),
                exposures: exposures.get(&v.id).copied().unwrap_or(0),
                metrics,
            }
        })
        .collect::<Vec<_>>();
    let comparisons = adjust_all(&mut variants);
    // a stopped variant's bucket is served the control unrecorded: the split is checked over
    // the active variants
    let active: Vec<usize> = (0..variants.len())
        .filter(|&i| variants[i].stopped.is_none())
        .collect();
    let observed: Vec<u64> = active.iter().map(|&i| variants[i].units).collect();
    let active_weights: Vec<f64> = active.iter().map(|&i| weights[i]).collect();
    Results {
        experiment: e.name.clone(),
        analysis,
        control: control.clone(),
        alpha: ALPHA,
        sequential_tuning: tuning,
        comparisons,
        srm: srm(&observed, &active_weights),
        variants,
        bandit: None,
    }
}

/// Fills `adjusted` of every comparison when there is more than one; returns how many there are.
fn adjust_all(variants: &mut [VariantResult]) -> usize {
    let mut welch_p = vec![];
    let mut seq_p = vec![];
    for v in variants.iter() {
        for r in v.metrics.values() {
            if let Some(c) = &r.vs_control {
                welch_p.push(c.p_value);
                seq_p.push(r.sequential.map(|s| s.p_value).unwrap_or(f64::NAN));
            }
        }
    }
    if welch_p.len() > 1 {
        let (holm_p, bh_p, seq_holm) = (holm(&welch_p), benjamini_hochberg(&welch_p), holm(&seq_p));
        let mut i = 0;
        for v in variants.iter_mut() {
            for r in v.metrics.values_mut() {
                if r.vs_control.is_some() {
                    r.adjusted = Some(Adjusted {
                        holm: holm_p[i],
                        bh: bh_p[i],
                        sequential_holm: seq_holm[i],
                    });
                    i += 1;
                }
            }
        }
    }
    welch_p.len()
}
