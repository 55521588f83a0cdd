//! What each variant's fan-out spent per UTC day (`fanout_spend`), against its
//! `daily_spend_cap` (`fanout.rs`): added to as answers are settled, read before admitting one.

use super::{Pool, Store, StoreError};

impl Store {
    /// What `variant` of `experiment` has spent on fan-out on `day` (`YYYY-MM-DD`, UTC).
    pub async fn fanout_spent(
        &self,
        experiment: &str,
        variant: &str,
        day: &str,
    ) -> Result<f64, StoreError> {
        let q =
            "SELECT spent FROM fanout_spend WHERE experiment = $1 AND variant = $2 AND day = $3";
        let row: Option<(f64,)> = on_pool!(self, p => sqlx::query_as(q)
            .bind(experiment).bind(variant).bind(day).fetch_optional(p).await?);
        Ok(row.map_or(0.0, |r| r.0))
    }

    /// Adds `cost` to the day's fan-out spend of `variant` (one statement: concurrent adds all
    /// count).
    pub async fn add_fanout_spend(
        &self,
        experiment: &str,
        variant: &str,
        day: &str,
        cost: f64,
    ) -> Result<(), StoreError> {
        let q = "INSERT INTO fanout_spend (experiment, variant, day, spent) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (experiment, variant, day) DO UPDATE SET spent = fanout_spend.spent + excluded.spent";
        on_pool!(self, p => sqlx::query(q)
            .bind(experiment).bind(variant).bind(day).bind(cost).execute(p).await?.rows_affected());
        Ok(())
    }
}
