//! LoRA adapters on the one shared model: GGUF LoRA files (as llama.cpp's
//! `convert_lora_to_gguf.py` writes them), each loaded once, applied per sequence.
//!
//! - [`AdapterSet`]: what a request runs under — adapters with their scales, in one canonical
//!   form (sorted by path, zero scales left out as llama.cpp leaves them out), so two spellings
//!   of one set are one set. The base model is the empty set.
//! - [`AdapterBudget`] (`budget.rs`): the memory the plan reserved for adapters
//!   (`--adapter-memory`), and the adapters admitted into it, each sized from its GGUF tensor
//!   table before anything is loaded; loaded once, on demand, unloaded when nothing references
//!   them and their room is needed; an adapter that cannot fit is refused with every number, as
//!   is a file that is not a LoRA adapter of this model's architecture.
//!
//! Invariants: the engine thread loads an adapter only after the budget admitted it (so what
//! is loaded never exceeds the plan), and applies one set per decode call (the scheduler
//! groups sequences by set: `scheduler/mod.rs`). KV is keyed by the set that computed it: a
//! cached prefix, a stream copy or a stored prefix is reused only under the same set.

mod budget;

use std::path::{Path, PathBuf};

use abserve_protocol::Adapter;

pub use self::budget::{AdapterBudget, AdapterLease, Pins};
use crate::invalid::PrepareError;

/// Adapters applied together, with their scales (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterSet(Vec<(PathBuf, u32)>);

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

/// The set a request's `adapters` name, resolved and admitted into the plan's reservation, with
/// the lease that keeps them loaded while the request lives.
pub fn adapter_set(
    budget: Option<&AdapterBudget>,
    adapters: Option<&[Adapter]>,
) -> Result<(AdapterSet, AdapterLease), PrepareError> {
    let adapters = adapters.unwrap_or_default();
    if adapters.is_empty() {
        return Ok(Default::default());
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
    let lease = budget.admit(&set, "adapters")?;
    Ok((set, lease))
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
