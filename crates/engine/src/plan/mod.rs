//! The memory plan: how much of a memory budget the weights, the KV cache and the compute
//! buffers take, made from the GGUF header alone before anything is loaded.
//!
//! Everything that loads a model goes through [`MemoryPlan::new`]; the engine sizes its one KV
//! cache from `kv_cells` and the scheduler never admits more KV demand than that, which is
//! what makes "out of memory" impossible by construction rather than by luck.
//!
//! `bytes`: budgets and sizes as people write and read them; `system`: this machine's and
//! this process's memory (`/proc`, cgroups); `split`: the device side of the plan; `compute`:
//! the compute reservation, per context (adapter lanes have one each).

use std::fmt;

use serde::Serialize;

use crate::gguf::ModelShape;

mod bytes;
mod compute_buffers;
mod split;
mod system;

pub use bytes::{human_bytes, parse_bytes, Budget};
pub use compute_buffers::{compute_estimate, lanes_compute, COMPUTE_RUNTIME_BYTES};
use split::Split;
pub use split::{DeviceMemory, DevicePlan, Offload};
pub use system::{available_memory, current_rss, peak_rss, return_large_frees};

/// Granularity llama.cpp pads the context (KV cells) to.
pub const KV_PAD: u64 = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    #[default]
    F16,
    Q8_0,
}

impl KvType {
    /// Bytes for `n` elements of this type (q8_0 packs 32 elements into 34 bytes).
    pub fn bytes_for(self, n: u64) -> u64 {
        match self {
            KvType::F16 => n * 2,
            KvType::Q8_0 => n.div_ceil(32) * 34,
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            other => Err(format!("unknown KV type '{other}' (expected f16 or q8_0)")),
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        })
    }
}

#[derive(Debug, Clone)]
pub struct PlanRequest {
    pub weights_bytes: u64,
    /// Memory reserved for LoRA adapter tensors (`adapters.rs`), taken before KV.
    pub adapter_bytes: u64,
    pub shape: ModelShape,
    pub kv_type: KvType,
    /// The memory the budget is a share of (available memory, or a device's size).
    pub memory_total: u64,
    pub budget: Budget,
    /// Fraction of the budget kept free (default 0.10).
    pub margin: f64,
    /// Per-sequence context (prompt + generated tokens).
    pub context: u64,
    /// Tokens one llama_decode processes at most (prefill chunk size).
    pub n_batch: u64,
    /// Upper bound on concurrent sequences (llama.cpp's n_seq_max).
    pub max_sequences: u64,
    /// Never allocate more KV than this many tokens even when the budget allows it
    /// (`None`: max_sequences × context).
    pub kv_cells_cap: Option<u64>,
    /// llama.cpp flash attention (changes the size of the attention scratch).
    pub flash_attention: bool,
    /// One KV pool shared by every sequence (`true`) or one fixed stream of cells per sequence
    /// slot (`false`, the default: each token attends only to its own sequence's cells).
    pub kv_unified: bool,
    /// Host-memory prefix store in bytes; `None`: 5% of the budget with split streams, none
    /// with a unified cache.
    pub prefix_store: Option<u64>,
    /// Layers offloaded to a device (`None` or 0 layers: everything on the host).
    pub offload: Option<Offload>,
    /// llama.cpp contexts on the one model that share out the slots, each with its own compute
    /// buffers (adapter lanes, `crate::lane_split`; 1: one context).
    pub lanes: u64,
    /// A draft model for speculative decoding (`--draft-model`), on the host.
    pub draft: Option<DraftRequest>,
}

/// A draft model in the plan: its weights, and a context laid out as the main one's (the same
/// cells and slots: its KV per cell is added to the main model's) with its own compute buffers.
#[derive(Debug, Clone, Copy)]
pub struct DraftRequest {
    pub weights_bytes: u64,
    pub shape: ModelShape,
}

/// Bytes of K and V of one token over every layer of a model of `s`.
fn kv_per_token(s: &ModelShape, kv_type: KvType) -> u64 {
    kv_type.bytes_for(s.n_layer * s.n_head_kv * s.head_dim_k)
        + kv_type.bytes_for(s.n_layer * s.n_head_kv * s.head_dim_v)
}

impl PlanRequest {
    /// The compute buffers of `lanes` contexts sharing `slots` slots and `kv_cells` cells, and
    /// the draft model's context over all of them.
    fn compute(&self, slots: u64, kv_cells: u64) -> u64 {
        lanes_compute(
            &self.shape,
            self.n_batch,
            self.lanes,
            slots,
            kv_cells,
            self.flash_attention,
        ) + self.draft.map_or(0, |d| {
            compute_estimate(
                &d.shape,
                self.n_batch,
                slots,
                kv_cells,
                self.flash_attention,
            )
        })
    }

    /// Bytes of K and V of one token over every layer of the model.
    fn kv_bytes_per_token(&self) -> u64 {
        kv_per_token(&self.shape, self.kv_type)
    }

    /// The draft model's K and V of one token (0 without one).
    fn draft_kv_bytes_per_token(&self) -> u64 {
        self.draft
            .map_or(0, |d| kv_per_token(&d.shape, self.kv_type))
    }

    /// The host budget in bytes, its margin and what is left to plan with.
    fn host_budget(&self) -> (u64, u64, u64) {
        let budget = match self.budget {
            Budget::Bytes(b) => b,
            Budget::Fraction(f) => (self.memory_total as f64 * f) as u64,
        };
        let margin = (budget as f64 * self.margin.clamp(0.0, 0.9)) as u64;
        (budget, margin, budget - margin)
    }

    /// Host memory for saved prompt prefixes: none with a unified pool, else as asked (default
    /// 5% of the budget).
    fn prefix_store_bytes(&self, budget: u64) -> u64 {
        if self.kv_unified {
            0
        } else {
            self.prefix_store.unwrap_or(budget / 20)
        }
    }

    /// What one naive copy of the model needs: its weights, the compute of one sequence and
    /// the KV of one `per_slot` context.
    fn one_copy_bytes(&self, per_slot: u64) -> u64 {
        self.weights_bytes
            + compute_estimate(&self.shape, self.n_batch, 1, per_slot, self.flash_attention)
            + per_slot * self.kv_bytes_per_token()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    pub weights_bytes: u64,
    /// Reserved for LoRA adapters, beside the weights: on the device for the offloaded layers'
    /// share (`split.rs`), on the host for the rest.
    pub adapter_bytes: u64,
    /// The draft model's weights (`--draft-model`; 0 without one); its KV per token is part of
    /// `kv_bytes_per_token`, its compute buffers of `compute_bytes`.
    pub draft_weights_bytes: u64,
    pub draft_kv_bytes_per_token: u64,
    pub kv_type: KvType,
    pub kv_bytes_per_token: u64,
    pub compute_bytes: u64,
    pub budget_bytes: u64,
    pub margin_bytes: u64,
    pub usable_bytes: u64,
    /// KV cells (tokens over all sequences) the cache is created with.
    pub kv_cells: u64,
    pub kv_bytes: u64,
    pub context: u64,
    /// Concurrent sequences of `context` tokens each that fit in `kv_cells`.
    pub full_context_sequences: u64,
    /// llama.cpp's n_seq_max: how many sequences may be live at once (shorter ones can
    /// outnumber `full_context_sequences`; admission is by KV cells, not by count).
    pub seq_slots: u64,
    pub n_batch: u64,
    /// llama.cpp contexts the slots are divided between (adapter lanes; 1: one context), each
    /// with its own compute buffers, counted in `compute_bytes`.
    pub lanes: u64,
    pub flash_attention: bool,
    /// One KV pool for all sequences (unified) or one stream per slot.
    pub kv_unified: bool,
    /// Cells each slot's stream holds (split streams: `pad256(context)`, no borrowing between
    /// slots, so `kv_cells = seq_slots × kv_cells_per_slot`); unified: `kv_cells`.
    pub kv_cells_per_slot: u64,
    /// Host memory for saved prompt prefixes (split streams), taken from the budget before KV.
    pub prefix_store_bytes: u64,
    /// weights + kv + compute + prefix store, host and device together.
    pub planned_bytes: u64,
    /// The host's part of `planned_bytes` (all of it without offload): what RSS is held to.
    pub host_planned_bytes: u64,
    /// The device's budget and part of `planned_bytes`, when layers are offloaded.
    pub device_budget_bytes: Option<u64>,
    pub device_planned_bytes: Option<u64>,
    pub device: Option<DevicePlan>,
    /// How many separate copies of the model (each with one sequence of `context`) fit in the
    /// usable budget: the naive harness's question.
    pub copies_that_fit: u64,
    pub fits: bool,
    pub shape: ModelShape,
}

/// The margin as a whole percentage of the budget, for error messages.
fn margin_pct(margin: u64, budget: u64) -> f64 {
    if budget > 0 {
        (margin as f64 / budget as f64 * 100.0).round()
    } else {
        0.0
    }
}

#[derive(Debug, thiserror::Error)]
#[error(
    "model does not fit the {place}: weights {weights} + minimum KV {min_kv} ({context} tokens × {per_token} B) + compute {compute} = {need} > usable {usable} (budget {budget} minus {margin_pct}% margin {margin})"
)]
pub struct DoesNotFit {
    /// "memory budget", or the device's budget with its name and free memory.
    pub place: String,
    pub weights: u64,
    pub min_kv: u64,
    pub context: u64,
    pub per_token: u64,
    pub compute: u64,
    pub need: u64,
    pub usable: u64,
    pub budget: u64,
    pub margin: u64,
    pub margin_pct: f64,
}

impl MemoryPlan {
    pub fn new(req: &PlanRequest) -> MemoryPlan {
        let s = &req.shape;
        let kv_bytes_per_token = req.kv_bytes_per_token() + req.draft_kv_bytes_per_token();
        let (budget_bytes, margin_bytes, usable_bytes) = req.host_budget();
        let max_slots = req.max_sequences.clamp(1, 256);
        let context = req.context.max(1);
        // split streams: every slot owns pad256(context) cells (llama.cpp pads n_ctx_seq to 256)
        let per_slot = if req.kv_unified {
            context
        } else {
            context.div_ceil(KV_PAD) * KV_PAD
        };
        let cap = req.kv_cells_cap.unwrap_or(max_slots * per_slot);
        let prefix_store_bytes = req.prefix_store_bytes(budget_bytes);
        let split = Split::new(req, req.kv_bytes_per_token());
        let fit = split.cells_that_fit(req, usable_bytes, prefix_store_bytes, max_slots);
        let (kv_cells, seq_slots, kv_cells_per_slot, full_context_sequences) = if req.kv_unified {
            let kv_cells = (fit.min(cap) / KV_PAD) * KV_PAD;
            (
                kv_cells,
                max_slots,
                kv_cells,
                (kv_cells / context).min(max_slots),
            )
        } else {
            let slots = (fit.min(cap) / per_slot).min(max_slots);
            (slots * per_slot, slots.max(1), per_slot, slots)
        };
        let compute_bytes = req.compute(seq_slots, kv_cells);
        let kv_bytes = kv_cells * kv_bytes_per_token;
        let device = split.device_plan(kv_cells, compute_bytes);
        // with layers on a device, the compute buffers that grow with the KV sit there; the host
        // keeps the fixed part (inputs, logits, outputs), counted in full to stay on the safe side
        let host_compute = if device.is_some() {
            req.compute(seq_slots, 0)
        } else {
            compute_bytes
        };
        let host_planned_bytes = split.host_weights
            + kv_cells * split.kv_host_per_token
            + host_compute
            + prefix_store_bytes;
        // the naive harness's question, asked of the memory the model would live in
        let copies_that_fit = device.as_ref().map_or(usable_bytes, |d| d.usable_bytes)
            / req.one_copy_bytes(per_slot).max(1);
        let device_fits = device
            .as_ref()
            .is_none_or(|d| d.planned_bytes <= d.usable_bytes);
        MemoryPlan {
            weights_bytes: req.weights_bytes,
            adapter_bytes: req.adapter_bytes,
            draft_weights_bytes: req.draft.map_or(0, |d| d.weights_bytes),
            draft_kv_bytes_per_token: req.draft_kv_bytes_per_token(),
            kv_type: req.kv_type,
            kv_bytes_per_token,
            compute_bytes,
            budget_bytes,
            margin_bytes,
            usable_bytes,
            kv_cells,
            kv_bytes,
            context,
            full_context_sequences,
            seq_slots,
            n_batch: req.n_batch,
            lanes: req.lanes.clamp(1, seq_slots),
            flash_attention: req.flash_attention,
            kv_unified: req.kv_unified,
            kv_cells_per_slot,
            prefix_store_bytes,
            planned_bytes: host_planned_bytes + device.as_ref().map_or(0, |d| d.planned_bytes),
            host_planned_bytes,
            device_budget_bytes: device.as_ref().map(|d| d.budget_bytes),
            device_planned_bytes: device.as_ref().map(|d| d.planned_bytes),
            copies_that_fit,
            fits: full_context_sequences >= 1 && host_planned_bytes <= usable_bytes && device_fits,
            device,
            shape: *s,
        }
    }

    /// Err with every number when not even one sequence of `context` fits beside the weights,
    /// on the device (when layers are offloaded) or in host memory.
    pub fn check_fits(&self) -> Result<(), DoesNotFit> {
        if self.fits {
            return Ok(());
        }
        if let Some(d) = &self.device {
            let per_token =
                self.kv_bytes_per_token * d.layers_offloaded / self.shape.n_layer.max(1);
            let min_kv = self.context * per_token;
            let compute = compute_estimate(
                &self.shape,
                self.n_batch,
                1,
                self.context,
                self.flash_attention,
            );
            if d.weights_bytes + min_kv + compute <= d.usable_bytes
                && d.planned_bytes <= d.usable_bytes
            {
                return Err(self.host_does_not_fit());
            }
            return Err(DoesNotFit {
                place: format!(
                    "device budget of {} ({} layers of {} offloaded; {} B free of {} B)",
                    d.name, d.layers_offloaded, d.n_layer, d.free_bytes, d.total_bytes
                ),
                weights: d.weights_bytes,
                min_kv,
                context: self.context,
                per_token,
                compute,
                need: d.weights_bytes + min_kv + compute,
                usable: d.usable_bytes,
                budget: d.budget_bytes,
                margin: d.margin_bytes,
                margin_pct: margin_pct(d.margin_bytes, d.budget_bytes),
            });
        }
        Err(self.host_does_not_fit())
    }

    fn host_does_not_fit(&self) -> DoesNotFit {
        // with layers offloaded, the host holds the other layers' weights and KV
        let (weights, per_token, compute) = match &self.device {
            Some(d) => (
                self.weights_bytes - d.weights_bytes,
                self.kv_bytes_per_token
                    - self.kv_bytes_per_token * d.layers_offloaded / self.shape.n_layer.max(1),
                lanes_compute(
                    &self.shape,
                    self.n_batch,
                    self.lanes,
                    self.seq_slots,
                    0,
                    self.flash_attention,
                ),
            ),
            // a draft model's weights are held beside the model's
            None => (
                self.weights_bytes + self.draft_weights_bytes,
                self.kv_bytes_per_token,
                self.compute_bytes,
            ),
        };
        let min_kv = self.context * per_token;
        DoesNotFit {
            place: "memory budget".into(),
            weights,
            min_kv,
            context: self.context,
            per_token,
            compute,
            need: weights + min_kv + compute,
            usable: self.usable_bytes,
            budget: self.budget_bytes,
            margin: self.margin_bytes,
            margin_pct: margin_pct(self.margin_bytes, self.budget_bytes),
        }
    }

    /// One line per component, as `abserve serve` logs it at start-up.
    pub fn summary_lines(&self) -> Vec<String> {
        let mut lines = self.host_lines();
        if let Some(d) = &self.device {
            lines.push(format!(
                "device {} ({}): {} of {} layers offloaded; weights {}, kv {}, compute {} = {} planned, budget {} (margin {}) of {} free",
                d.name,
                d.backend,
                d.layers_offloaded,
                d.n_layer,
                human_bytes(d.weights_bytes),
                human_bytes(d.kv_bytes),
                human_bytes(d.compute_bytes),
                human_bytes(d.planned_bytes),
                human_bytes(d.budget_bytes),
                human_bytes(d.margin_bytes),
                human_bytes(d.free_bytes),
            ));
        }
        lines
    }

    fn host_lines(&self) -> Vec<String> {
        vec![
            format!(
                "memory: weights {}{}, kv {} ({} tokens, {} B/token, {}), compute {}, prefix store {}, budget {} (margin {})",
                human_bytes(self.weights_bytes),
                if self.adapter_bytes > 0 {
                    format!(", adapters {}", human_bytes(self.adapter_bytes))
                } else {
                    String::new()
                } + &if self.draft_weights_bytes > 0 {
                    format!(
                        ", draft model {} (its KV {} B/token of the kv)",
                        human_bytes(self.draft_weights_bytes),
                        self.draft_kv_bytes_per_token
                    )
                } else {
                    String::new()
                },
                human_bytes(self.kv_bytes),
                self.kv_cells,
                self.kv_bytes_per_token,
                self.kv_type,
                human_bytes(self.compute_bytes),
                human_bytes(self.prefix_store_bytes),
                human_bytes(self.budget_bytes),
                human_bytes(self.margin_bytes),
            ),
            if self.kv_unified {
                format!(
                    "capacity: {} concurrent sequences of {} tokens in one unified KV cache ({} sequence slots, prefill chunk {})",
                    self.full_context_sequences, self.context, self.seq_slots, self.n_batch
                )
            } else {
                format!(
                    "capacity: {} sequence slots × {} KV cells (one stream each, context {} tokens, prefill chunk {}){}",
                    self.seq_slots,
                    self.kv_cells_per_slot,
                    self.context,
                    self.n_batch,
                    if self.lanes > 1 {
                        format!(" in {} adapter lanes, each a context with its own compute buffers", self.lanes)
                    } else {
                        String::new()
                    }
                )
            },
        ]
    }
}

#[cfg(test)]
mod tests;
