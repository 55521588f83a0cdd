//! The plan's reservation for LoRA adapters and what is admitted into it: adapters are loaded
//! once, on demand, and unloaded when nothing references them and their room is needed.
//!
//! An admitted adapter is referenced by
//! - the server's start (`--lora`): loaded before the first request, never unloaded;
//! - an experiment that names it (the pins: [`AdapterBudget::pin_with`]), while it exists;
//! - every request that runs under it, from preparation until its sequence ends or is dropped
//!   (an [`AdapterLease`], held by the request and then by its sequence).
//!
//! An adapter nothing references stays loaded until another needs its room, least recently used
//! first (vLLM's LRU of adapters), so a stream of requests naming one adapter does not reload it
//! each time. One that does not fit even after every unreferenced adapter is unloaded is refused
//! with every number: for good (400) when adapters loaded at start and pinned by experiments
//! leave it no room, for now (429, retry) when requests running under other adapters do.
//!
//! Invariants: what llama.cpp holds never exceeds the reservation. The engine thread loads an
//! adapter only after the budget admitted it, and before any load it frees every adapter the
//! budget unloaded ([`AdapterBudget::take_unloaded`]), first taking it off the context. An
//! adapter unloaded and admitted again before the engine thread freed it is taken off the list
//! (it is still loaded and counted again).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::AdapterSet;
use crate::gguf::GgufHeader;
use crate::invalid::PrepareError;
use crate::plan::human_bytes;

/// The adapter names experiments reference now (as requests name them: a path given at start
/// or a file under the adapter folder).
pub type Pins = Box<dyn Fn() -> Vec<String> + Send + Sync>;

/// The plan's reservation for adapters and what was admitted into it (see the module doc).
/// Clones share one reservation.
#[derive(Clone)]
pub struct AdapterBudget {
    inner: Arc<Inner>,
}

struct Inner {
    /// Bytes the memory plan set aside for adapter tensors.
    reserved: u64,
    /// The model's architecture (`general.architecture`): an adapter must name the same.
    arch: String,
    /// The model's tensor names: every adapter tensor must adapt one of them.
    tensors: Vec<String>,
    /// Adapters loaded at start (`--lora`) and the folder others may come from
    /// (`--adapter-dir`): nothing else may be named.
    preloaded: Vec<PathBuf>,
    dir: Option<PathBuf>,
    state: Mutex<State>,
    pins: RwLock<Option<Pins>>,
}

#[derive(Default)]
struct State {
    admitted: BTreeMap<PathBuf, Entry>,
    /// Ticks of admissions and releases, for least-recently-used order.
    clock: u64,
    /// Unloaded from the budget, not yet freed by the engine thread.
    unloaded: Vec<PathBuf>,
    /// What llama.cpp holds now (the engine thread says).
    loaded: BTreeSet<PathBuf>,
    /// Adapters unloaded since start.
    unloads: u64,
}

struct Entry {
    bytes: u64,
    /// Requests holding a lease on it.
    users: usize,
    last_used: u64,
}

/// A request's hold on the adapters of its set: while it lives they are not unloaded.
#[derive(Default)]
pub struct AdapterLease {
    held: Option<(Arc<Inner>, Vec<PathBuf>)>,
}

impl std::fmt::Debug for AdapterLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths = self.held.as_ref().map(|(_, p)| p.len()).unwrap_or(0);
        write!(f, "AdapterLease({paths} adapters)")
    }
}

impl Clone for AdapterLease {
    fn clone(&self) -> Self {
        if let Some((inner, paths)) = &self.held {
            inner.lock().hold(paths);
        }
        AdapterLease {
            held: self.held.clone(),
        }
    }
}

impl Drop for AdapterLease {
    fn drop(&mut self) {
        if let Some((inner, paths)) = &self.held {
            let mut s = inner.lock();
            s.clock += 1;
            let now = s.clock;
            for p in paths {
                if let Some(e) = s.admitted.get_mut(p) {
                    e.users = e.users.saturating_sub(1);
                    e.last_used = now;
                }
            }
        }
    }
}

impl State {
    fn hold(&mut self, paths: &[PathBuf]) {
        self.clock += 1;
        let now = self.clock;
        for p in paths {
            if let Some(e) = self.admitted.get_mut(p) {
                e.users += 1;
                e.last_used = now;
            }
        }
    }
    fn used(&self) -> u64 {
        self.admitted.values().map(|e| e.bytes).sum()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn absolute(p: &Path) -> PathBuf {
    p.canonicalize()
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

/// Bytes held in the reservation, by why they cannot be unloaded.
#[derive(Default)]
struct Held {
    at_start: (u64, usize),
    pinned: (u64, usize),
    running: (u64, usize),
}

impl AdapterBudget {
    /// The plan's `reserved` bytes for adapters of `model`: the `preloaded` ones are admitted
    /// first (an error if they do not fit or are not adapters of it), then requests may name
    /// them or files under `dir`.
    pub fn new(
        reserved: u64,
        model: &GgufHeader,
        preloaded: &[PathBuf],
        dir: Option<&Path>,
    ) -> Result<AdapterBudget, PrepareError> {
        let b = AdapterBudget {
            inner: Arc::new(Inner {
                reserved,
                arch: model.architecture().unwrap_or_default().to_string(),
                tensors: model.tensors.iter().map(|t| t.name.clone()).collect(),
                preloaded: preloaded.iter().map(|p| absolute(p)).collect(),
                dir: dir.map(absolute),
                state: Mutex::new(State::default()),
                pins: RwLock::new(None),
            }),
        };
        // one at a time, each with its own field in errors
        for (i, p) in b.inner.preloaded.iter().enumerate() {
            let set = AdapterSet::new([(p.clone(), 1.0)], "--lora")?;
            b.admit(&set, &format!("--lora[{i}]"))?;
        }
        Ok(b)
    }

    /// Where the names experiments reference come from (the server's routing table): they are
    /// not unloaded while an experiment names them.
    pub fn pin_with(&self, pins: Pins) {
        *self.inner.pins.write().unwrap_or_else(|p| p.into_inner()) = Some(pins);
    }

    /// The adapter a request names, resolved: a path as given at start, or a file under the
    /// adapter folder (relative paths are taken inside it); anything else is refused.
    pub fn resolve(&self, path: &str, field: &str) -> Result<PathBuf, PrepareError> {
        let given = Path::new(path);
        let resolved = absolute(given);
        if self.inner.preloaded.contains(&resolved) {
            return Ok(resolved);
        }
        if let Some(dir) = &self.inner.dir {
            let p = if given.is_absolute() {
                given.to_path_buf()
            } else {
                dir.join(given)
            };
            if let Ok(real) = p.canonicalize() {
                let root = dir.canonicalize().unwrap_or_else(|_| dir.clone());
                if real.starts_with(&root) && real.is_file() {
                    return Ok(real);
                }
            }
        }
        Err(PrepareError::new(
            field,
            format!(
                "'{path}' is not an adapter of this server: name one it was started with \
                 (--lora) or a file under its --adapter-dir{}",
                self.inner
                    .dir
                    .as_ref()
                    .map(|d| format!(" ({})", d.display()))
                    .unwrap_or_default()
            ),
        ))
    }

    pub fn reserved(&self) -> u64 {
        self.inner.reserved
    }

    /// Bytes of the adapters admitted now.
    pub fn used(&self) -> u64 {
        self.inner.lock().used()
    }

    /// The adapters admitted now, with their bytes.
    pub fn admitted(&self) -> Vec<(PathBuf, u64)> {
        let s = self.inner.lock();
        s.admitted
            .iter()
            .map(|(p, e)| (p.clone(), e.bytes))
            .collect()
    }

    /// The adapters llama.cpp holds now.
    pub fn loaded(&self) -> Vec<PathBuf> {
        self.inner.lock().loaded.iter().cloned().collect()
    }

    /// Adapters unloaded since start.
    pub fn unloads(&self) -> u64 {
        self.inner.lock().unloads
    }

    /// The engine thread loaded `path` into llama.cpp.
    pub(crate) fn mark_loaded(&self, path: &Path) {
        self.inner.lock().loaded.insert(path.to_path_buf());
    }

    /// What the budget unloaded since the last call, for the engine thread to free now (before
    /// it loads anything); each is marked freed.
    pub(crate) fn take_unloaded(&self) -> Vec<PathBuf> {
        let mut s = self.inner.lock();
        let gone = std::mem::take(&mut s.unloaded);
        for p in &gone {
            s.loaded.remove(p);
        }
        gone
    }

    fn pinned(&self) -> BTreeSet<PathBuf> {
        let names = match &*self.inner.pins.read().unwrap_or_else(|p| p.into_inner()) {
            Some(f) => f(),
            None => return BTreeSet::new(),
        };
        names
            .iter()
            .filter_map(|n| self.resolve(n, "").ok())
            .collect()
    }

    /// Checks `set`'s adapters, admits those not admitted yet into the reservation (unloading
    /// unreferenced ones, least recently used first, where room is needed) and holds them for a
    /// request; or says why not with every number. `field` names the set in errors.
    pub fn admit(&self, set: &AdapterSet, field: &str) -> Result<AdapterLease, PrepareError> {
        let paths: Vec<PathBuf> = set.iter().map(|(p, _)| p.to_path_buf()).collect();
        loop {
            // headers are read outside the lock; an adapter is checked each time it is admitted
            let mut fresh = Vec::new();
            for (i, p) in paths.iter().enumerate() {
                if !self.inner.lock().admitted.contains_key(p) {
                    let at = format!("{field}[{i}].path");
                    fresh.push((i, p.clone(), self.check_file(p, &at)?));
                }
            }
            let pinned = if fresh.is_empty() {
                BTreeSet::new()
            } else {
                self.pinned()
            };
            let mut s = self.inner.lock();
            // one admitted when looked at may have been unloaded since: look again
            let gone = paths
                .iter()
                .any(|p| !s.admitted.contains_key(p) && !fresh.iter().any(|(_, f, _)| f == p));
            if gone {
                continue;
            }
            for (i, path, bytes) in fresh {
                if s.admitted.contains_key(&path) {
                    continue; // admitted meanwhile by another request
                }
                if s.used() + bytes > self.inner.reserved {
                    self.make_room(&mut s, bytes, &paths, &pinned);
                }
                if s.used() + bytes > self.inner.reserved {
                    let at = format!("{field}[{i}].path");
                    return Err(self.no_room(&s, &path, bytes, &pinned, &at));
                }
                // unloaded but not yet freed: it is still loaded, keep it
                s.unloaded.retain(|p| *p != path);
                let e = Entry {
                    bytes,
                    users: 0,
                    last_used: 0,
                };
                s.admitted.insert(path, e);
            }
            s.hold(&paths);
            return Ok(AdapterLease {
                held: Some((self.inner.clone(), paths)),
            });
        }
    }

    /// Whether nothing references `path` but its admission (see the module doc).
    fn unreferenced(&self, path: &Path, e: &Entry, pinned: &BTreeSet<PathBuf>) -> bool {
        e.users == 0 && !pinned.contains(path) && !self.inner.preloaded.iter().any(|p| p == path)
    }

    /// Unloads unreferenced adapters (not those of `keep`), least recently used first, until
    /// `bytes` fit or none is left.
    fn make_room(&self, s: &mut State, bytes: u64, keep: &[PathBuf], pinned: &BTreeSet<PathBuf>) {
        let mut idle: Vec<(u64, PathBuf)> = s
            .admitted
            .iter()
            .filter(|(p, e)| !keep.contains(p) && self.unreferenced(p, e, pinned))
            .map(|(p, e)| (e.last_used, p.clone()))
            .collect();
        idle.sort();
        for (_, p) in idle {
            if s.used() + bytes <= self.inner.reserved {
                break;
            }
            s.admitted.remove(&p);
            tracing::info!("adapter {} unloaded: nothing references it", p.display());
            s.unloaded.push(p);
            s.unloads += 1;
        }
    }

    /// Why `path` (`bytes`) does not fit after unloading what could be: every number.
    fn no_room(
        &self,
        s: &State,
        path: &Path,
        bytes: u64,
        pinned: &BTreeSet<PathBuf>,
        at: &str,
    ) -> PrepareError {
        let mut held = Held::default();
        for (p, e) in &s.admitted {
            let slot = if self.inner.preloaded.iter().any(|x| x == p) {
                &mut held.at_start
            } else if pinned.contains(p) {
                &mut held.pinned
            } else {
                &mut held.running
            };
            slot.0 += e.bytes;
            slot.1 += 1;
        }
        let reserved = self.inner.reserved;
        let for_good = held.at_start.0 + held.pinned.0 + bytes > reserved;
        let mut err = PrepareError::new(
            at,
            format!(
                "{} needs {} for its tensors; the memory plan reserved {} for adapters: {} held \
                 by {} loaded at start (--lora), {} by {} that experiments name, {} by {} that \
                 running requests use ({})",
                path.display(),
                human_bytes(bytes),
                human_bytes(reserved),
                human_bytes(held.at_start.0),
                held.at_start.1,
                human_bytes(held.pinned.0),
                held.pinned.1,
                human_bytes(held.running.0),
                held.running.1,
                if for_good {
                    "start the server with a larger --adapter-memory, or delete experiments"
                } else {
                    "retry when they finish"
                }
            ),
        )
        .beyond(reserved - s.used().min(reserved), bytes);
        if !for_good {
            err = err.retry_later();
        }
        err
    }

    /// The bytes of the adapter at `path`, from its tensor table, once it is known to be a LoRA
    /// adapter of this model.
    fn check_file(&self, path: &Path, at: &str) -> Result<u64, PrepareError> {
        let h = GgufHeader::read(path).map_err(|e| PrepareError::new(at, e.to_string()))?;
        let bad = |m: String| PrepareError::new(at, format!("{}: {m}", path.display()));
        if h.str("general.type") != Some("adapter") || h.str("adapter.type") != Some("lora") {
            return Err(bad(
                "not a LoRA adapter (general.type must be 'adapter' and adapter.type 'lora')"
                    .into(),
            ));
        }
        let arch = h.architecture().unwrap_or_default();
        if arch != self.inner.arch {
            return Err(bad(format!(
                "an adapter for architecture '{arch}', the model is '{}'",
                self.inner.arch
            )));
        }
        for t in &h.tensors {
            let base = t
                .name
                .strip_suffix(".lora_a")
                .or_else(|| t.name.strip_suffix(".lora_b"));
            match base {
                Some(b) if self.inner.tensors.iter().any(|m| m == b) => {}
                _ => {
                    return Err(bad(format!(
                        "tensor '{}' adapts no tensor of the model",
                        t.name
                    )))
                }
            }
        }
        Ok(h.weights_bytes())
    }
}

impl std::fmt::Debug for AdapterBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterBudget")
            .field("reserved", &self.inner.reserved)
            .field("used", &self.used())
            .finish()
    }
}
