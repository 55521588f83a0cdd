//! A bandit's data in the store: each unit's period (by the time of its first exposure against
//! the stored period starts), variant and value of the decision metric (by its definition's
//! aggregation; without one, the mean of its events; units without a value are left out), as
//! `bandit::Cell`s; what `/results` shows (its estimates are what the server's update,
//! [`next_bandit`], reads), with each arm's `cost` per unit, period-weighted the same way, as a
//! secondary read-out.

use super::{Pool, Store, StoreError};
use crate::experiment::Experiment;
use abserve_statistics::bandit::{
    chance_best, estimates, weights, winner, Arm, BanditResults, Cell, Estimate, NamedWinner,
    Period, Settings,
};
use abserve_statistics::{Aggregation, MetricDef};

/// Per unit exposed (not forced): variant, time of its first exposure, and of metric `$2` the
/// sum, count, count not 0 and maximum of its events.
fn units_sql() -> String {
    format!(
        "WITH first AS (SELECT unit, MIN(id) AS id FROM exposures WHERE experiment = $1 AND NOT forced GROUP BY unit),
    uv AS (SELECT first.unit, x.variant, x.ts AS t0 FROM first JOIN exposures x ON x.id = first.id),
    per AS (SELECT unit, SUM(value) AS s, COUNT(*) AS c, {} AS nz, MAX(value) AS mx FROM events
        WHERE experiment = $1 AND metric = $2 GROUP BY unit)
    SELECT uv.variant, uv.t0, per.s, COALESCE(per.c, 0), COALESCE(per.nz, 0), per.mx
    FROM uv LEFT JOIN per ON per.unit = uv.unit",
        super::nonzero("value")
    )
}

type UnitRow = (String, f64, Option<f64>, i64, i64, Option<f64>);

/// Per unit exposed (not forced) with a cost: variant, time of its first exposure, and its
/// mean cost over its non-forced exposures (the automatic metric's value of the unit).
const COST_SQL: &str = "WITH first AS (SELECT unit, MIN(id) AS id FROM exposures WHERE experiment = $1 AND NOT forced GROUP BY unit),
    uv AS (SELECT first.unit, x.variant, x.ts AS t0 FROM first JOIN exposures x ON x.id = first.id),
    per AS (SELECT unit, AVG(cost) AS c FROM exposures
        WHERE experiment = $1 AND NOT forced AND cost IS NOT NULL GROUP BY unit)
    SELECT uv.variant, uv.t0, per.c FROM uv JOIN per ON per.unit = uv.unit";

impl Store {
    /// The decision metric's cells, `[period][variant]`.
    pub async fn bandit_cells(&self, e: &Experiment) -> Result<Vec<Vec<Cell>>, StoreError> {
        let metric = e.decision_metric.clone().unwrap_or_default();
        let q = units_sql();
        let rows: Vec<UnitRow> =
            on_pool!(self, p => sqlx::query_as(&q).bind(&e.name).bind(&metric).fetch_all(p).await?);
        let def = e.metrics.iter().find(|m| m.name == metric).cloned();
        let def = def.unwrap_or(MetricDef {
            name: metric,
            aggregation: Aggregation::Mean,
            direction: Default::default(),
            cap: None,
            cuped: false,
            lookback_days: None,
        });
        Ok(cells_by_period(
            e,
            rows.into_iter()
                .filter_map(|(variant, t0, sum, count, nonzero, max)| {
                    let x = def.unit_value((sum, count, nonzero, max).into())?;
                    Some((variant, t0, x))
                }),
        ))
    }

    /// The `cost` cells, `[period][variant]` (the secondary read-out).
    async fn cost_cells(&self, e: &Experiment) -> Result<Vec<Vec<Cell>>, StoreError> {
        let rows: Vec<(String, f64, f64)> =
            on_pool!(self, p => sqlx::query_as(COST_SQL).bind(&e.name).fetch_all(p).await?);
        Ok(cells_by_period(e, rows.into_iter()))
    }

    /// A bandit's read-out (`None` for a fixed experiment).
    pub async fn bandit_results(
        &self,
        e: &Experiment,
    ) -> Result<Option<BanditResults>, StoreError> {
        if e.bandit_settings().is_none() {
            return Ok(None);
        }
        let est = estimates(&self.bandit_cells(e).await?);
        let cost = estimates(&self.cost_cells(e).await?);
        let chances = chance_best(
            &est,
            e.direction_of(e.decision_metric.as_deref().unwrap_or("")),
        );
        let weights = e.weights();
        let arms = e
            .variants
            .iter()
            .enumerate()
            .map(|(k, v)| Arm {
                variant: v.id.clone(),
                estimate: est[k],
                chance_best: chances[k],
                weight: weights[k],
                cost: Some(cost[k]).filter(|c| c.units > 0),
            })
            .collect();
        let state = e.bandit_state.clone().unwrap_or_default();
        Ok(Some(BanditResults {
            decision_metric: e.decision_metric.clone().unwrap_or_default(),
            periods: state.periods.len(),
            arms,
            winner: state.winner,
        }))
    }
}

/// Per-unit values `(variant, time of first exposure, value)` as cells `[period][variant]`, by
/// the stored period starts; values of variants no longer defined are left out.
fn cells_by_period(
    e: &Experiment,
    values: impl Iterator<Item = (String, f64, f64)>,
) -> Vec<Vec<Cell>> {
    let starts: Vec<f64> = e
        .bandit_state
        .as_ref()
        .map(|s| s.periods.iter().map(|p| p.start).collect())
        .unwrap_or_default();
    let mut cells = vec![vec![Cell::default(); e.variants.len()]; starts.len() + 1];
    for (variant, t0, x) in values {
        if let Some(k) = e.variants.iter().position(|v| v.id == variant) {
            cells[starts.partition_point(|&t| t <= t0)][k].add(x);
        }
    }
    cells
}

/// A bandit's next state from its arms' estimates at `now` (seconds since the epoch): the
/// winner when the stopping rule names one once every arm is explored, else the next period's
/// Thompson weights; `None` for a fixed experiment, a bandit with a winner, or one whose
/// period is not over.
pub fn next_bandit(e: &Experiment, est: &[Estimate], now: f64) -> Option<Experiment> {
    let settings = e.bandit_settings()?;
    let state = e.bandit_state.clone().unwrap_or_default();
    if state.winner.is_some()
        || state
            .periods
            .last()
            .is_some_and(|p| now - p.start < settings.update_seconds)
    {
        return None;
    }
    let direction = e.direction_of(e.decision_metric.as_deref().unwrap_or(""));
    let tuning = e
        .sequential_tuning
        .unwrap_or(abserve_statistics::DEFAULT_TUNING);
    let mut next = e.clone();
    let mut state = state;
    let explored = est.iter().all(|x| x.units >= settings.exploration_units);
    match winner(est, direction, abserve_statistics::ALPHA, tuning).filter(|_| explored) {
        Some(w) => {
            state.winner = Some(NamedWinner {
                variant: e.variants[w.arm].id.clone(),
                at: now,
                units: est.iter().map(|x| x.units).sum(),
                p_values: w
                    .p_values
                    .iter()
                    .map(|(k, p)| (e.variants[*k].id.clone(), *p))
                    .collect(),
            });
        }
        None => {
            let s = Settings {
                exploration_units: settings.exploration_units,
                floor: settings.floor,
            };
            state.periods.push(Period {
                start: now,
                weights: weights(est, direction, &s),
            });
        }
    }
    next.bandit_state = Some(state);
    Some(next)
}

impl Store {
    /// Every unit's variant (that of its first non-forced exposure): what keeps a bandit's
    /// units on their variant when its weights change.
    pub async fn first_variants(
        &self,
        experiment: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        const Q: &str = "
            WITH first AS (SELECT unit, MIN(id) AS id FROM exposures WHERE experiment = $1 AND NOT forced GROUP BY unit)
            SELECT first.unit, x.variant FROM first JOIN exposures x ON x.id = first.id";
        Ok(on_pool!(self, p => sqlx::query_as(Q).bind(experiment).fetch_all(p).await?))
    }
}
