//! The A/B layer's state in the server: the experiments it routes (in memory, read on every
//! request) and the store (SQLite, or PostgreSQL shared with other replicas) that persists them
//! with exposures and events.
//!
//! Replicas: an experiment written through any replica reaches this one's routing table within
//! the poll interval (`--store-poll`), and at once on PostgreSQL, whose NOTIFY wakes the reload.
//! A reload that raced a local write is discarded (a generation count), so a replica never
//! forgets, even briefly, an experiment it has just created.
//!
//! Lock policy (the server's, for every lock): a poisoned lock is read through. Each critical
//! section is a single insert, remove, replace or read, so a panic elsewhere cannot leave the
//! data half-written, and one failed request must not take every later one down with it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use abserve_ab::{Experiment, Exposure, Store};
use abserve_protocol::location::Location;

use crate::error::ApiError;

#[derive(Default)]
struct Routing {
    by_name: BTreeMap<String, Experiment>,
    /// Bumped by every local change, so a reload read before it is not applied after it.
    generation: u64,
}

pub struct AbState {
    store: Store,
    routing: RwLock<Routing>,
    /// Per bandit experiment, each unit's variant: a unit keeps it when the weights change
    /// (filled as units are routed, and from the store by the periodic work: `periodic.rs`).
    sticky: RwLock<BTreeMap<String, std::collections::HashMap<String, String>>>,
    poll: Duration,
    reload: Arc<tokio::sync::Notify>,
    /// What capped variants' fan-out answers still running may cost (`spend.rs`).
    pub(super) holds: super::spend::Holds,
}

impl AbState {
    /// Connects to the store and loads the experiments file. Precedence: the file's definitions
    /// replace stored ones of the same name (so changes made over HTTP to an experiment that is
    /// also in the file last until the next start), unless `keep_stored`: then the file only
    /// adds experiments the store does not have. Either way a log line says what happened.
    pub async fn open(
        at: &Location,
        file: Option<&Path>,
        keep_stored: bool,
        poll: Duration,
    ) -> anyhow::Result<AbState> {
        let store = Store::connect(at).await?;
        tracing::info!(
            "experiment store: {} ({:?})",
            store.describe(),
            store.database()
        );
        if let Some(f) = file {
            let text = std::fs::read_to_string(f)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", f.display()))?;
            let (mut written, mut kept) = (vec![], vec![]);
            for e in abserve_ab::parse_file(&text)? {
                let fresh = if keep_stored {
                    store.create_experiment(&e).await?
                } else {
                    store.put_experiment(&e).await.map(|_| true)?
                };
                if fresh {
                    written.push(e.name)
                } else {
                    kept.push(e.name)
                }
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
        let by_name = store
            .experiments()
            .await?
            .into_iter()
            .map(|e| (e.name.clone(), e))
            .collect();
        Ok(AbState {
            store,
            routing: RwLock::new(Routing {
                by_name,
                generation: 0,
            }),
            sticky: Default::default(),
            poll,
            reload: Default::default(),
            holds: Default::default(),
        })
    }

    /// Checks every stored experiment's variants by the API's rules (a file or an older
    /// version may hold settings the API refuses), each on the model it names: `models` are
    /// the served models by id, the default first.
    pub fn check(&self, models: &abserve_models::Registry) -> anyhow::Result<()> {
        for e in self.list() {
            for v in &e.variants {
                let model = models.named(v.model.as_deref()).map_err(|why| {
                    anyhow::anyhow!("experiment '{}': variant '{}': {why}", e.name, v.id)
                })?;
                super::check_variant(v, model).map_err(|err| {
                    anyhow::anyhow!(
                        "experiment '{}': {}: {}",
                        e.name,
                        err.param.unwrap_or_default(),
                        err.message
                    )
                })?;
            }
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<Experiment> {
        self.routing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_name
            .get(name)
            .cloned()
    }

    /// The variant `unit` was given in bandit `experiment`, if it was.
    pub(crate) fn sticky(&self, experiment: &str, unit: &str) -> Option<String> {
        let s = self.sticky.read().unwrap_or_else(|p| p.into_inner());
        s.get(experiment).and_then(|m| m.get(unit)).cloned()
    }

    /// Keeps `unit` on `variant` in bandit `experiment` (the first variant given wins).
    pub(crate) fn stick(&self, experiment: &str, unit: &str, variant: &str) {
        let mut s = self.sticky.write().unwrap_or_else(|p| p.into_inner());
        s.entry(experiment.to_string())
            .or_default()
            .entry(unit.to_string())
            .or_insert_with(|| variant.to_string());
    }

    /// Every experiment, by name.
    pub fn list(&self) -> Vec<Experiment> {
        self.routing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_name
            .values()
            .cloned()
            .collect()
    }

    /// Routes `e` from now on (after the store has it).
    pub(crate) fn insert(&self, e: Experiment) {
        let mut r = self.routing.write().unwrap_or_else(|p| p.into_inner());
        r.by_name.insert(e.name.clone(), e);
        r.generation += 1;
    }

    /// Stops routing `name` (after the store dropped it).
    pub(crate) fn remove(&self, name: &str) {
        let mut r = self.routing.write().unwrap_or_else(|p| p.into_inner());
        r.by_name.remove(name);
        r.generation += 1;
    }

    /// Replaces the routing table with the store's experiments, unless a local change happened
    /// while they were read (the next reload picks that up).
    async fn reload(&self) -> Result<(), abserve_ab::StoreError> {
        let before = self
            .routing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .generation;
        let fresh: BTreeMap<String, Experiment> = self
            .store
            .experiments()
            .await?
            .into_iter()
            .map(|e| (e.name.clone(), e))
            .collect();
        let mut r = self.routing.write().unwrap_or_else(|p| p.into_inner());
        if r.generation == before && r.by_name != fresh {
            tracing::info!(
                "experiments changed in the store: now routing {:?}",
                fresh.keys().collect::<Vec<_>>()
            );
            r.by_name = fresh;
        }
        Ok(())
    }

    /// Keeps the routing table in step with the store: a reload every poll interval, and at
    /// once when PostgreSQL announces a change made through any replica.
    pub(crate) async fn sync(&self) {
        let wake = self.reload.clone();
        let _watcher = match self.store.watch(move || wake.notify_one()).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(
                    "store: cannot listen for experiment changes ({e}); polling every {:?}",
                    self.poll
                );
                None
            }
        };
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.poll) => {}
                _ = self.reload.notified() => {}
            }
            if let Err(e) = self.reload().await {
                tracing::warn!("store: reloading experiments: {e}");
            }
        }
    }

    /// The store, for one operation; its errors become API errors with `?` (see `store_error`).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Writes one exposure. The write runs in a task of its own: a caller dropped while it waits (a streaming client
    /// that closes once it read an error event drops the stream that records) does not cancel
    /// the write halfway, so an exposure once begun is written.
    pub async fn record_exposure(&self, experiment: String, x: Exposure) -> Result<(), ApiError> {
        let store = self.store.clone();
        let write = tokio::spawn(async move { store.record_exposure(&experiment, &x).await });
        match write.await {
            Ok(r) => r.map_err(store_error),
            Err(e) => Err(ApiError::internal(format!(
                "recording the exposure stopped: {e}"
            ))),
        }
    }
}

impl From<abserve_ab::StoreError> for ApiError {
    fn from(e: abserve_ab::StoreError) -> ApiError {
        store_error(e)
    }
}

/// A failed store operation as the client should see it: nothing of the request was stored,
/// and the status says whether and when to retry (507 disk full, 503 unwritable or busy).
fn store_error(e: abserve_ab::StoreError) -> ApiError {
    use abserve_ab::StoreCondition as C;
    let what = "Nothing of this request was stored";
    match e.condition() {
        C::Full => ApiError::insufficient_storage(format!(
            "The experiment store is full ({e}). {what}; retry once space is freed."
        )),
        C::Unwritable => ApiError::unavailable(format!(
            "The experiment store cannot be written ({e}). {what}."
        )),
        C::Busy => {
            let mut err = ApiError::unavailable(format!(
                "The experiment store is busy ({e}). {what}; retry shortly."
            ));
            err.retry_after = Some(1);
            err
        }
        C::Other => ApiError::internal(e.to_string()),
    }
}
