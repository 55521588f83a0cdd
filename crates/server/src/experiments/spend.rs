//! Daily spend caps of variants' fan-out (`daily_spend_cap`; `abserve_ab`'s `fanout.rs` states
//! the rule): before a capped variant's fan-out answer is sent, the most it can cost is held
//! against the cap; when it is answered, what it cost is added to the day's spend in the store
//! and the hold is let go (also when the answer failed or its client left: dropping a [`Held`]
//! lets go).
//!
//! Invariant: for each (experiment, variant), the day's stored spend + every hold ≤ the cap,
//! checked and held in one turn (a lock across the store's read), so concurrent fan-outs cannot
//! pass it together.

use std::collections::HashMap;
use std::sync::Mutex;

use abserve_ab::{utc_day, Variant, SPEND_CAP_HELP};

use super::AbState;

/// The holds of answers still running, per (experiment, variant).
#[derive(Default)]
pub(super) struct Holds {
    by_variant: Mutex<HashMap<(String, String), f64>>,
    turn: tokio::sync::Mutex<()>,
}

impl Holds {
    fn change(&self, key: &(String, String), by: f64) -> f64 {
        let mut m = self.by_variant.lock().unwrap_or_else(|p| p.into_inner());
        let held = m.entry(key.clone()).or_insert(0.0);
        *held = (*held + by).max(0.0);
        let now = *held;
        if now == 0.0 {
            m.remove(key);
        }
        now
    }
}

/// The most one answer can cost, held against its variant's cap until it is settled or dropped.
pub struct Held<'a> {
    ab: &'a AbState,
    key: (String, String),
    day: String,
    most: f64,
}

impl AbState {
    /// Holds `most` (the most this answer can cost) against `v`'s daily spend cap in
    /// `experiment`; `Ok(None)` for a variant without a cap; `Err` with the day's numbers when
    /// the answer could pass the cap (or the store cannot say what was spent: refused, not
    /// guessed).
    pub async fn hold_spend(
        &self,
        experiment: &str,
        v: &Variant,
        most: Option<f64>,
    ) -> Result<Option<Held<'_>>, String> {
        let Some(cap) = v.daily_spend_cap else {
            return Ok(None);
        };
        let Some(most) = most else {
            return Err(format!(
                "variant '{}' has a daily_spend_cap but its model has no prices, so what it spends is unknown",
                v.id
            ));
        };
        let _turn = self.holds.turn.lock().await;
        let day = utc_day(std::time::SystemTime::now());
        let spent = self
            .store()
            .fanout_spent(experiment, &v.id, &day)
            .await
            .map_err(|e| format!("variant '{}': its spend today cannot be read: {e}", v.id))?;
        let key = (experiment.to_string(), v.id.clone());
        let held = self.holds.change(&key, 0.0);
        if spent + held + most > cap {
            return Err(format!(
                "variant '{}' reached its daily fan-out spend cap of {cap}: {spent:.6} spent today \
                 ({day}, UTC) and {held:.6} held by answers still running, and this answer could \
                 cost up to {most:.6}; {SPEND_CAP_HELP}",
                v.id
            ));
        }
        self.holds.change(&key, most);
        Ok(Some(Held {
            ab: self,
            key,
            day,
            most,
        }))
    }
}

impl Held<'_> {
    /// Adds what the answer cost to the day's spend (before the hold is let go, so the two are
    /// never both missing from the sum).
    pub async fn settle(self, cost: Option<f64>) {
        let Some(cost) = cost.filter(|c| *c > 0.0) else {
            return;
        };
        let (e, v) = &self.key;
        if let Err(err) = self
            .ab
            .store()
            .add_fanout_spend(e, v, &self.day, cost)
            .await
        {
            tracing::warn!("experiment '{e}': variant '{v}': its fan-out spend of {cost} could not be stored: {err}");
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.ab.holds.change(&self.key, -self.most);
    }
}
