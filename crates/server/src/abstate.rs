//! The A/B layer's state in the server: the experiments it routes (in memory, read on every
//! request) and the store (SQLite) that persists them with exposures and events.
//!
//! Lock policy (the server's, for every lock): a poisoned lock is read through. Each critical
//! section is a single insert, remove, read or store call, so a panic elsewhere cannot leave the
//! data half-written, and one failed request must not take every later one down with it. Store
//! calls run on blocking threads, never on the async runtime.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use abserve_ab::{Experiment, Exposure, Store};

use crate::error::ApiError;

pub struct AbState {
    store: Arc<Mutex<Store>>,
    experiments: RwLock<BTreeMap<String, Experiment>>,
}

impl AbState {
    /// Opens the store and loads the experiments file. Precedence: the file's definitions
    /// replace stored ones of the same name (so changes made over HTTP to an experiment that is
    /// also in the file last until the next start), unless `keep_stored`: then the file only
    /// adds experiments the store does not have. Either way a log line says what happened.
    pub fn open(data_dir: &Path, file: Option<&Path>, keep_stored: bool) -> anyhow::Result<AbState> {
        let store = Store::open(data_dir)?;
        if let Some(f) = file {
            let text = std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?;
            let (mut written, mut kept) = (vec![], vec![]);
            for e in abserve_ab::parse_file(&text)? {
                let fresh = if keep_stored { store.create_experiment(&e)? } else { store.put_experiment(&e).map(|_| true)? };
                if fresh { written.push(e.name) } else { kept.push(e.name) }
            }
            if keep_stored {
                tracing::info!(
                    "experiments file {}: added {:?}; kept the stored definitions of {:?} (--keep-stored-experiments)",
                    f.display(), written, kept
                );
            } else {
                tracing::info!(
                    "experiments file {}: {:?} loaded, replacing stored definitions of the same name (changes made over HTTP to these are reverted at each start; --keep-stored-experiments keeps them)",
                    f.display(), written
                );
            }
        }
        let experiments = store.experiments()?.into_iter().map(|e| (e.name.clone(), e)).collect();
        Ok(AbState { store: Arc::new(Mutex::new(store)), experiments: RwLock::new(experiments) })
    }

    /// Checks every stored experiment's variants by the API's rules (a file or an older
    /// version may hold settings the API refuses), for the context the engine serves.
    pub fn check(&self, context: u64) -> anyhow::Result<()> {
        for e in self.list() {
            for v in &e.variants {
                crate::validate::variant(v, context).map_err(|err| anyhow::anyhow!("experiment '{}': {}: {}", e.name, err.param.unwrap_or_default(), err.message))?;
            }
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<Experiment> {
        self.experiments.read().unwrap_or_else(|p| p.into_inner()).get(name).cloned()
    }

    /// Every experiment, by name.
    pub fn list(&self) -> Vec<Experiment> {
        self.experiments.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Routes `e` from now on (after the store has it).
    pub(crate) fn insert(&self, e: Experiment) {
        self.experiments.write().unwrap_or_else(|p| p.into_inner()).insert(e.name.clone(), e);
    }

    /// Stops routing `name` (after the store dropped it).
    pub(crate) fn remove(&self, name: &str) {
        self.experiments.write().unwrap_or_else(|p| p.into_inner()).remove(name);
    }

    /// Runs a store operation off the async threads.
    pub(crate) async fn with_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, abserve_ab::StoreError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&mut store.lock().unwrap_or_else(|p| p.into_inner())))
            .await
            .map_err(|e| ApiError::internal(format!("storage task failed: {e}")))?
            .map_err(store_error)
    }

    pub async fn record_exposure(&self, experiment: String, x: Exposure) -> Result<(), ApiError> {
        self.with_store(move |s| s.record_exposure(&experiment, &x)).await
    }
}


/// A failed store operation as the client should see it: nothing of the request was stored,
/// and the status says whether and when to retry (507 disk full, 503 unwritable or busy).
fn store_error(e: abserve_ab::StoreError) -> ApiError {
    use abserve_ab::StoreCondition as C;
    let what = "Nothing of this request was stored";
    match e.condition() {
        C::Full => ApiError::insufficient_storage(format!("The experiment store is full ({e}). {what}; retry once space is freed.")),
        C::Unwritable => ApiError::unavailable(format!("The experiment store cannot be written ({e}). {what}.")),
        C::Busy => {
            let mut err = ApiError::unavailable(format!("The experiment store is busy ({e}). {what}; retry shortly."));
            err.retry_after = Some(1);
            err
        }
        C::Other => ApiError::internal(e.to_string()),
    }
}
