//! LoRA adapters on the one shared model: GGUF LoRA files (as llama.cpp's
//! `convert_lora_to_gguf.py` writes them), each loaded once, applied per sequence.
//!
//! - [`AdapterSet`]: what a request runs under — adapters with their scales, in one canonical
//!   form (sorted by path, zero scales left out as llama.cpp leaves them out), so two spellings
//!   of one set are one set. The base model is the empty set.
//! - [`AdapterBudget`]: the memory the plan reserved for adapters (`--adapter-memory`), and
//!   the adapters admitted into it, each sized from its GGUF tensor table before anything is
//!   loaded; an adapter that would pass the reservation is refused with every number, as is a
//!   file that is not a LoRA adapter of this model's architecture.
//!
//! Invariants: the engine thread loads an adapter only after the budget admitted it (so what
//! is loaded never exceeds the plan), and applies one set per decode call (the scheduler
//! groups sequences by set: `scheduler/mod.rs`). KV is keyed by the set that computed it: a
//! cached prefix, a stream copy or a stored prefix is reused only under the same set.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use abserve_protocol::Adapter;

use crate::gguf::GgufHeader;
use crate::invalid::PrepareError;
use crate::plan::human_bytes;

/// Adapters applied together, with their scales (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterSet(Vec<(PathBuf, u32)>);

/// Most adapters one set may hold: llama-cpp-2's setter applies one adapter to a context (a
/// set of several needs the raw context, which the safe crate does not give out).
pub const MAX_ADAPTERS_PER_SET: usize = 1;

impl AdapterSet {
    /// The set of `adapters` (path, scale); `field` names them in errors (`adapters`).
    pub fn new(
        adapters: impl IntoIterator<Item = (PathBuf, f32)>,
        field: &str,
    ) -> Result<AdapterSet, PrepareError> {
        let mut items: Vec<(PathBuf, u32)> = Vec::new();
        for (i, (path, scale)) in adapters.into_iter().enumerate() {
            if !scale.is_finite() {
                return Err(PrepareError::new(
                    format!("{field}[{i}].scale"),
                    format!("the scale must be a finite number, got {scale}"),
                ));
            }
            if items.iter().any(|(p, _)| *p == path) {
                return Err(PrepareError::new(
                    format!("{field}[{i}].path"),
                    format!("{} is named twice", path.display()),
                ));
            }
            if scale != 0.0 {
                items.push((path, scale.to_bits()));
            }
        }
        if items.len() > MAX_ADAPTERS_PER_SET {
            return Err(PrepareError::new(
                field,
                format!(
                    "at most {MAX_ADAPTERS_PER_SET} adapter with a non-zero scale per request \
                     (llama-cpp-2 applies one adapter to a context)"
                ),
            )
            .beyond(MAX_ADAPTERS_PER_SET, items.len()));
        }
        items.sort();
        Ok(AdapterSet(items))
    }

    /// The base model alone.
    pub fn is_base(&self) -> bool {
        self.0.is_empty()
    }

    /// The adapters and their scales.
    pub fn iter(&self) -> impl Iterator<Item = (&Path, f32)> {
        self.0
            .iter()
            .map(|(p, s)| (p.as_path(), f32::from_bits(*s)))
    }

    /// A short name for logs and labels: `base`, or `file.gguf×0.5+other.gguf×1`.
    pub fn label(&self) -> String {
        if self.is_base() {
            return "base".into();
        }
        self.iter()
            .map(|(p, s)| {
                let name = p.file_name().map_or(p.as_os_str(), |n| n).to_string_lossy();
                format!("{name}×{s}")
            })
            .collect::<Vec<_>>()
            .join("+")
    }
}

fn absolute(p: &Path) -> PathBuf {
    p.canonicalize()
        .or_else(|_| std::path::absolute(p))
        .unwrap_or_else(|_| p.to_path_buf())
}

/// The set a request's `adapters` name, resolved and admitted into the plan's reservation.
pub fn adapter_set(
    budget: Option<&AdapterBudget>,
    adapters: Option<&[Adapter]>,
) -> Result<AdapterSet, PrepareError> {
    let adapters = adapters.unwrap_or_default();
    if adapters.is_empty() {
        return Ok(AdapterSet::default());
    }
    // every adapter named must be one of the server's, also at scale 0 (which is the base)
    let Some(budget) = budget else {
        return Err(PrepareError::new(
            "adapters",
            "this model has no LoRA adapters (a server loads them for its first --model, with --lora or --adapter-dir)",
        ));
    };
    let mut items = Vec::new();
    for (i, a) in adapters.iter().enumerate() {
        items.push((
            budget.resolve(&a.path, &format!("adapters[{i}].path"))?,
            a.scale,
        ));
    }
    let set = AdapterSet::new(items, "adapters")?;
    budget.admit(&set, "adapters")?;
    Ok(set)
}

/// The plan's reservation for adapters and what was admitted into it.
#[derive(Debug)]
pub struct AdapterBudget {
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
    admitted: Mutex<BTreeMap<PathBuf, u64>>,
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
            reserved,
            arch: model.architecture().unwrap_or_default().to_string(),
            tensors: model.tensors.iter().map(|t| t.name.clone()).collect(),
            preloaded: preloaded.iter().map(|p| absolute(p)).collect(),
            dir: dir.map(absolute),
            admitted: Mutex::new(BTreeMap::new()),
        };
        // one at a time: a set holds at most MAX_ADAPTERS_PER_SET
        for (i, p) in b.preloaded.iter().enumerate() {
            let set = AdapterSet::new([(p.clone(), 1.0)], "--lora")?;
            b.admit(&set, &format!("--lora[{i}]"))?;
        }
        Ok(b)
    }

    /// The adapter a request names, resolved: a path as given at start, or a file under the
    /// adapter folder (relative paths are taken inside it); anything else is refused.
    pub fn resolve(&self, path: &str, field: &str) -> Result<PathBuf, PrepareError> {
        let given = Path::new(path);
        let resolved = absolute(given);
        if self.preloaded.contains(&resolved) {
            return Ok(resolved);
        }
        if let Some(dir) = &self.dir {
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
                self.dir
                    .as_ref()
                    .map(|d| format!(" ({})", d.display()))
                    .unwrap_or_default()
            ),
        ))
    }

    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Bytes of the adapters admitted so far.
    pub fn used(&self) -> u64 {
        self.lock().values().sum()
    }

    /// The adapters admitted, with their bytes.
    pub fn admitted(&self) -> Vec<(PathBuf, u64)> {
        self.lock().iter().map(|(p, b)| (p.clone(), *b)).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<PathBuf, u64>> {
        self.admitted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks `set`'s adapters and admits those not admitted yet into the reservation, or says
    /// why not with every number. `field` names the set in errors.
    pub fn admit(&self, set: &AdapterSet, field: &str) -> Result<(), PrepareError> {
        let mut admitted = self.lock();
        for (i, (path, _)) in set.iter().enumerate() {
            if admitted.contains_key(path) {
                continue;
            }
            let at = format!("{field}[{i}].path");
            let bytes = self.check_file(path, &at)?;
            let used: u64 = admitted.values().sum();
            if used + bytes > self.reserved {
                return Err(PrepareError::new(
                    at,
                    format!(
                        "{} needs {} for its tensors; the memory plan reserved {} for adapters \
                         and {} of it is taken by {} adapter(s) (start the server with a larger \
                         --adapter-memory)",
                        path.display(),
                        human_bytes(bytes),
                        human_bytes(self.reserved),
                        human_bytes(used),
                        admitted.len()
                    ),
                )
                .beyond(self.reserved - used, bytes));
            }
            admitted.insert(path.to_path_buf(), bytes);
        }
        Ok(())
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
        if arch != self.arch {
            return Err(bad(format!(
                "an adapter for architecture '{arch}', the model is '{}'",
                self.arch
            )));
        }
        for t in &h.tensors {
            let base = t
                .name
                .strip_suffix(".lora_a")
                .or_else(|| t.name.strip_suffix(".lora_b"));
            match base {
                Some(b) if self.tensors.iter().any(|m| m == b) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_canonical_and_zero_scales_are_the_base() {
        let a =
            AdapterSet::new([("b.gguf".into(), 0.0), ("a.gguf".into(), 1.0)], "adapters").unwrap();
        let b = AdapterSet::new([("a.gguf".into(), 1.0)], "adapters").unwrap();
        assert_eq!(a, b);
        assert!(AdapterSet::new([("a.gguf".into(), 0.0)], "adapters")
            .unwrap()
            .is_base());
        assert_ne!(
            b,
            AdapterSet::new([("a.gguf".into(), 0.5)], "adapters").unwrap()
        );
        assert_eq!(b.label(), "a.gguf×1");
        let e = AdapterSet::new([("a.gguf".into(), f32::NAN)], "adapters").unwrap_err();
        assert_eq!(e.field, "adapters[0].scale");
        let e = AdapterSet::new([("a".into(), 1.0), ("a".into(), 2.0)], "adapters").unwrap_err();
        assert_eq!(e.field, "adapters[1].path");
    }
}
