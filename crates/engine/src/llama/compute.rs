//! The scheduler's [`Compute`] over the engine thread's llama.cpp contexts (one, or one per
//! adapter lane): decode calls forwarded to [`Context`], routed by slot to its lane's context
//! and run side by side across lanes, and the adapter sets applied and freed (what the plan's
//! adapter budget admitted is loaded on first use; what it unloaded is freed before anything
//! else is loaded). A prefix given across lanes goes through host memory.

use std::collections::HashMap;
use std::path::PathBuf;
use std::ptr::NonNull;

use llama_cpp_2::model::LlamaLoraAdapter;

use super::{Context, Drafter, Model};
use crate::adapters::{AdapterBudget, AdapterSet};
use crate::lane_split::Lanes;
use crate::scheduler::{Compute, DraftAsk, Snapshot};

/// The scheduler's [`Compute`] over the engine thread's llama.cpp contexts: one, or one per
/// adapter lane (`crate::lane_split`), all on the one model's weights.
pub(crate) struct LlamaCompute<'m> {
    pub model: &'m Model,
    /// One per lane, lane order.
    pub lanes: Vec<Lane<'m>>,
    /// Which lane holds which slot.
    pub split: Lanes,
    /// LoRA adapters loaded on the model, by path (freed when the budget unloads them, else
    /// with the model).
    pub loras: HashMap<PathBuf, LlamaLoraAdapter>,
    /// The plan's adapter reservation: what may be loaded, and what to free.
    pub budget: Option<AdapterBudget>,
    /// The batch being built: each token's lane and index in that lane's batch.
    pub index: Vec<(usize, usize)>,
    /// Stream copies within a lane since the last decode, (source, destination) slots: llama.cpp
    /// lands them at the next decode, so a copy to another lane reads a destination's source.
    pub pending: Vec<(i32, i32)>,
    /// The engine's threads, divided between the lanes that decode at once.
    pub threads: i32,
    /// Slots whose prefix copy across lanes failed: they hold nothing of what the scheduler
    /// counts, so a batch with them is refused until they are removed.
    pub broken: Vec<i32>,
    /// A broken slot in the batch being built (the batch is refused at `decode`).
    pub refused: Option<i32>,
    /// The draft model's context (`--draft-model`), on the slots of every lane.
    pub drafter: Option<Drafter<'m>>,
}

/// One llama.cpp context and the adapter set applied to it.
pub(crate) struct Lane<'m> {
    pub ctx: Context<'m>,
    pub applied: AdapterSet,
    /// Tokens in this lane's part of the batch being built.
    pub tokens: usize,
}

impl<'m> Lane<'m> {
    pub fn new(ctx: Context<'m>) -> Self {
        Lane {
            ctx,
            applied: AdapterSet::default(),
            tokens: 0,
        }
    }
}

/// A lane's context handed to a decode thread.
struct Decoding<'a, 'm>(&'a mut Context<'m>);

// SAFETY: a `Context` is a llama.cpp context with its own batch; it is moved to one scoped
// thread for one `llama_decode` and back, never used by two threads at once. llama.cpp
// supports concurrent decodes on distinct contexts of one model: the model's weights and its
// adapters are only read during a decode, and adapters are loaded, applied and freed on the
// engine thread between decodes.
unsafe impl Send for Decoding<'_, '_> {}

impl<'m> LlamaCompute<'m> {
    /// Frees the adapters the budget unloaded, taking them off every context first.
    fn free_unloaded(&mut self) -> Result<(), String> {
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        for path in budget.take_unloaded() {
            for lane in &mut self.lanes {
                if lane.applied.iter().any(|(p, _)| p == path) {
                    lane.ctx.set_adapters(&[])?;
                    lane.applied = AdapterSet::default();
                }
            }
            if let Some(a) = self.loras.remove(&path) {
                // SAFETY: `LlamaLoraAdapter` is #[repr(transparent)] over
                // `NonNull<llama_adapter_lora>` (see `Model::load_lora`), so this is the pointer
                // llama.cpp gave. No context applies it any more (taken off above), no other
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

    fn apply(&mut self, lane: usize, set: &AdapterSet) -> Result<(), String> {
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
        self.lanes[lane].ctx.set_adapters(&adapters)
    }

    /// The context of `slot`'s lane and the slot's sequence id there.
    fn at(&mut self, slot: i32) -> (&mut Context<'m>, i32) {
        let (lane, local) = (self.split.lane_of(slot), self.split.local(slot));
        (&mut self.lanes[lane].ctx, local)
    }

    /// Decodes every lane that has tokens: one on this thread, several side by side (one
    /// scoped thread each). With several lanes decoding, a lane without a KV slot fails the call (its
    /// neighbours' decodes cannot be taken back); split streams, which lanes require, never
    /// lack one.
    fn decode_lanes(&mut self) -> Result<bool, String> {
        let n = self.lanes.iter().filter(|l| l.tokens > 0).count().max(1) as i32;
        let threads = (self.threads / n).max(1);
        let busy: Vec<(usize, Decoding<'_, '_>)> = self
            .lanes
            .iter_mut()
            .enumerate()
            .filter(|(_, l)| l.tokens > 0)
            .map(|(i, l)| {
                l.ctx.set_threads(threads);
                (i, Decoding(&mut l.ctx))
            })
            .collect();
        if busy.len() == 1 {
            let (_, Decoding(ctx)) = busy.into_iter().next().expect("one lane");
            return ctx.decode();
        }
        let results: Vec<(usize, Result<bool, String>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = busy
                .into_iter()
                .map(|(i, d)| {
                    scope.spawn(move || {
                        // the whole `Decoding` moves in (a closure would capture only its
                        // field, which is not `Send`)
                        let d = d;
                        (i, d.0.decode())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| (usize::MAX, Err("a decode thread panicked".into())))
                })
                .collect()
        });
        let mut failed = Vec::new();
        for (i, r) in results {
            match r {
                Ok(true) => {}
                Ok(false) => failed.push(format!("lane {i} found no KV slot")),
                Err(e) => failed.push(format!("lane {i}: {e}")),
            }
        }
        if failed.is_empty() {
            Ok(true)
        } else {
            Err(failed.join("; "))
        }
    }
}

impl Compute for LlamaCompute<'_> {
    fn batch_capacity(&self) -> usize {
        self.lanes[0].ctx.batch_capacity()
    }
    fn clear_batch(&mut self) {
        for lane in &mut self.lanes {
            lane.ctx.clear_batch();
            lane.tokens = 0;
        }
        self.index.clear();
        self.refused = None;
    }
    fn add(&mut self, token: i32, pos: usize, seq: i32, logits: bool) {
        let (l, local) = (self.split.lane_of(seq), self.split.local(seq));
        let lane = &mut self.lanes[l];
        lane.ctx.add(token, pos, local, logits);
        self.index.push((l, lane.tokens));
        lane.tokens += 1;
        if self.broken.contains(&seq) {
            self.refused.get_or_insert(seq);
        }
    }
    fn decode(&mut self) -> Result<bool, String> {
        self.pending.clear();
        if let Some(s) = self.refused {
            return Err(format!(
                "sequence {s}'s prompt prefix could not be copied from another adapter lane"
            ));
        }
        self.decode_lanes()
    }
    fn logits(&self, batch_index: usize) -> &[f32] {
        let (lane, i) = self.index[batch_index];
        self.lanes[lane].ctx.logits(i)
    }
    fn remove_seq(&mut self, seq: i32) {
        self.broken.retain(|&s| s != seq);
        let (ctx, local) = self.at(seq);
        ctx.remove_seq(local)
    }
    fn share_prefix(&mut self, src: i32, dst: i32, len: usize) {
        let (ls, ld) = (self.split.lane_of(src), self.split.lane_of(dst));
        let d = self.split.local(dst);
        if ls == ld {
            self.pending.push((src, dst));
            return self.lanes[ls]
                .ctx
                .share_prefix(self.split.local(src), d, len);
        }
        // another lane's context: through host memory (llama.cpp's sequence state), from where
        // the positions are now (a copy not landed yet still holds them at its source, which
        // nothing changes before the next decode); the source stays in its lane
        let mut from = src;
        while let Some(&(s0, _)) = self.pending.iter().rev().find(|p| p.1 == from) {
            from = s0;
        }
        let s = self.split.local(from);
        let copied = self.lanes[ls]
            .ctx
            .save_seq(s)
            .is_some_and(|st| self.lanes[ld].ctx.restore_seq(&st, d));
        if copied {
            self.lanes[ld].ctx.truncate_seq(d, len);
        } else {
            // the scheduler counts the positions as given, and llama.cpp would decode after a
            // hole without complaint: a copy that failed fails the next decode of `dst`, named
            tracing::error!("copying sequence {src} to {dst} across lanes failed");
            self.lanes[ld].ctx.remove_seq(d);
            self.broken.push(dst);
        }
    }
    fn truncate_seq(&mut self, seq: i32, len: usize) {
        let (ctx, local) = self.at(seq);
        ctx.truncate_seq(local, len)
    }
    fn save_seq(&mut self, seq: i32) -> Option<(Snapshot, usize)> {
        let (ctx, local) = self.at(seq);
        let st = ctx.save_seq(local)?;
        let n = st.byte_len();
        Some((Box::new(st), n))
    }
    fn restore_seq(&mut self, snap: &Snapshot, seq: i32) -> bool {
        let (ctx, local) = self.at(seq);
        match snap.downcast_ref::<llama_cpp_2::SeqState>() {
            Some(st) => ctx.restore_seq(st, local),
            None => false,
        }
    }
    fn piece(&self, token: i32) -> Vec<u8> {
        self.model.piece(token)
    }
    fn is_eog(&self, token: i32) -> bool {
        self.model.is_eog(token)
    }
    fn set_adapters(&mut self, lane: usize, set: &AdapterSet) -> Result<(), String> {
        // what was unloaded is freed before anything else is loaded: loaded <= reserved
        self.free_unloaded()?;
        if *set == self.lanes[lane].applied {
            return Ok(());
        }
        self.apply(lane, set)?;
        self.lanes[lane].applied = set.clone();
        tracing::debug!("lane {lane}: adapters {} applied", set.label());
        Ok(())
    }
    fn has_draft_model(&self) -> bool {
        self.drafter.is_some()
    }
    fn draft(&mut self, asks: &[DraftAsk<'_>]) -> Result<Vec<Vec<i32>>, String> {
        match &mut self.drafter {
            Some(d) => d.draft(asks),
            None => Err("no draft model".into()),
        }
    }
    fn draft_behind(&self, slot: i32, tokens: &[i32]) -> usize {
        self.drafter
            .as_ref()
            .map_or(usize::MAX, |d| d.behind(slot, tokens))
    }
}
