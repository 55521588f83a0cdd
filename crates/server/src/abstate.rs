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
    /// Opens the store and loads the experiments file (its definitions replace stored ones).
    pub fn open(data_dir: &Path, file: Option<&Path>) -> anyhow::Result<AbState> {
        let store = Store::open(data_dir)?;
        if let Some(f) = file {
            let text = std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?;
            for e in abserve_ab::parse_file(&text)? {
                store.put_experiment(&e)?;
            }
        }
        let experiments = store.experiments()?.into_iter().map(|e| (e.name.clone(), e)).collect();
        Ok(AbState { store: Arc::new(Mutex::new(store)), experiments: RwLock::new(experiments) })
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
            .map_err(|e| ApiError::internal(e.to_string()))
    }

    pub async fn record_exposure(&self, experiment: String, x: Exposure) -> Result<(), ApiError> {
        self.with_store(move |s| s.record_exposure(&experiment, &x)).await
    }
}

