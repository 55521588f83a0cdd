//! Whose units: each exposure records the name of the key whose request it was
//! (`exposures.caller`), so an inference key's outcome events can be held to the units its own
//! requests were served for.

use std::collections::BTreeSet;

use super::{Pool, Store, StoreError};

/// Units asked about per statement (a bind parameter each; SQLite allows 32,766).
const CHUNK: usize = 500;

impl Store {
    /// Which of `units` have an exposure in `experiment` from a request of the key named `caller`.
    pub async fn units_served_to(
        &self,
        experiment: &str,
        caller: &str,
        units: &BTreeSet<&str>,
    ) -> Result<BTreeSet<String>, StoreError> {
        let units: Vec<&str> = units.iter().copied().collect();
        let mut served = BTreeSet::new();
        for chunk in units.chunks(CHUNK) {
            let marks: Vec<String> = (3..chunk.len() + 3).map(|i| format!("${i}")).collect();
            let q = format!(
                "SELECT DISTINCT unit FROM exposures WHERE experiment = $1 AND caller = $2 AND unit IN ({})",
                marks.join(", ")
            );
            let rows: Vec<String> = on_pool!(self, p => {
                let mut query = sqlx::query_scalar(&q).bind(experiment).bind(caller);
                for u in chunk {
                    query = query.bind(*u);
                }
                query.fetch_all(p).await?
            });
            served.extend(rows);
        }
        Ok(served)
    }
}
