//! The scheduler's [`Compute`] over the one llama.cpp context: decode calls forwarded to
//! [`Context`], and the adapter sets applied and freed (what the plan's adapter budget admitted
//! is loaded on first use; what it unloaded is freed before anything else is loaded).

use std::collections::HashMap;
use std::path::PathBuf;
use std::ptr::NonNull;

use llama_cpp_2::model::LlamaLoraAdapter;

use super::{Context, Model};
use crate::adapters::{AdapterBudget, AdapterSet};
use crate::scheduler::{Compute, Snapshot};

/// The scheduler's [`Compute`] over the one llama.cpp context (the engine thread's).
pub(crate) struct LlamaCompute<'m> {
    pub model: &'m Model,
    pub ctx: Context<'m>,
    /// LoRA adapters loaded on the model, by path (freed when the budget unloads them, else
    /// with the model).
    pub loras: HashMap<PathBuf, LlamaLoraAdapter>,
    /// The set applied to the context now.
    pub applied: AdapterSet,
    /// The plan's adapter reservation: what may be loaded, and what to free.
    pub budget: Option<AdapterBudget>,
}

impl LlamaCompute<'_> {
    /// Frees the adapters the budget unloaded, taking them off the context first.
    fn free_unloaded(&mut self) -> Result<(), String> {
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        for path in budget.take_unloaded() {
            if self.applied.iter().any(|(p, _)| p == path) {
                self.apply(&AdapterSet::default())?;
                self.applied = AdapterSet::default();
            }
            if let Some(a) = self.loras.remove(&path) {
                // SAFETY: `LlamaLoraAdapter` is #[repr(transparent)] over
                // `NonNull<llama_adapter_lora>` (see `Model::load_lora`), so this is the pointer
                // llama.cpp gave. The context no longer applies it (taken off above), no other
                // handle to it exists (removed from the map, which held the only one), and
                // llama.cpp's free unregisters it from the model before deleting it.
                unsafe {
                    let raw = std::mem::transmute::<
                        LlamaLoraAdapter,
                        NonNull<llama_cpp_sys_2::llama_adapter_lora>,
                    >(a);
                    llama_cpp_sys_2::llama_adapter_lora_free(raw.as_ptr());
                }
                tracing::debug!("adapter {} freed", path.display());
            }
        }
        Ok(())
    }

    fn apply(&mut self, set: &AdapterSet) -> Result<(), String> {
        for (path, _) in set.iter() {
            if !self.loras.contains_key(path) {
                let a = self.model.load_lora(path)?;
                self.loras.insert(path.to_path_buf(), a);
                if let Some(b) = &self.budget {
                    b.mark_loaded(path);
                }
            }
        }
        let adapters: Vec<(&LlamaLoraAdapter, f32)> =
            set.iter().map(|(p, s)| (&self.loras[p], s)).collect();
        self.ctx.set_adapters(&adapters)
    }
}

impl Compute for LlamaCompute<'_> {
    fn batch_capacity(&self) -> usize {
        self.ctx.batch_capacity()
    }
    fn clear_batch(&mut self) {
        self.ctx.clear_batch()
    }
    fn add(&mut self, token: i32, pos: usize, seq: i32, logits: bool) {
        self.ctx.add(token, pos, seq, logits)
    }
    fn decode(&mut self) -> Result<bool, String> {
        self.ctx.decode()
    }
    fn logits(&self, batch_index: usize) -> &[f32] {
        self.ctx.logits(batch_index)
    }
    fn remove_seq(&mut self, seq: i32) {
        self.ctx.remove_seq(seq)
    }
    fn share_prefix(&mut self, src: i32, dst: i32, len: usize) {
        self.ctx.share_prefix(src, dst, len)
    }
    fn truncate_seq(&mut self, seq: i32, len: usize) {
        self.ctx.truncate_seq(seq, len)
    }
    fn save_seq(&mut self, seq: i32) -> Option<(Snapshot, usize)> {
        let st = self.ctx.save_seq(seq)?;
        let n = st.byte_len();
        Some((Box::new(st), n))
    }
    fn restore_seq(&mut self, snap: &Snapshot, seq: i32) -> bool {
        match snap.downcast_ref::<llama_cpp_2::SeqState>() {
            Some(st) => self.ctx.restore_seq(st, seq),
            None => false,
        }
    }
    fn piece(&self, token: i32) -> Vec<u8> {
        self.model.piece(token)
    }
    fn is_eog(&self, token: i32) -> bool {
        self.model.is_eog(token)
    }
    fn set_adapters(&mut self, set: &AdapterSet) -> Result<(), String> {
        // what was unloaded is freed before anything else is loaded: loaded <= reserved
        self.free_unloaded()?;
        if *set == self.applied {
            return Ok(());
        }
        self.apply(set)?;
        self.applied = set.clone();
        Ok(())
    }
}
