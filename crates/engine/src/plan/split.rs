//! The device side of the plan: what goes to a device when layers are offloaded ([`Offload`]),
//! the device's part of the plan ([`DevicePlan`]), and how KV cells are sized so that both the
//! host and the device hold their share.

use serde::Serialize;

use super::{Budget, PlanRequest};

/// One device's memory, read now (by `crate::device`; the plan needs only these numbers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// ggml's name, e.g. `CUDA0`, `Vulkan0`.
    pub name: String,
    /// What it is, e.g. `NVIDIA H200` or `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub description: String,
    /// The ggml backend: `CUDA`, `Vulkan`, `Metal`, `CPU`.
    pub backend: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
}

impl DeviceMemory {
    pub fn used_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.free_bytes)
    }
}

/// What goes to a device: the last `layers` transformer layers (llama.cpp's `n_gpu_layers`),
/// their weights, their KV cells and the compute buffers.
#[derive(Debug, Clone)]
pub struct Offload {
    /// The device as it was when the plan was made (free memory sizes a fractional budget).
    pub device: DeviceMemory,
    /// Bytes or a share of the device's free memory (`--device-memory`).
    pub budget: Budget,
    /// Transformer layers offloaded (at most the model's).
    pub layers: u64,
    /// Bytes of weights placed on the device (from the GGUF tensor table).
    pub weights_bytes: u64,
}

/// The device part of a plan.
#[derive(Debug, Clone, Serialize)]
pub struct DevicePlan {
    pub name: String,
    pub backend: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// Device memory in use when the plan was made (other processes, other models).
    pub used_before_bytes: u64,
    pub layers_offloaded: u64,
    pub n_layer: u64,
    pub budget_bytes: u64,
    pub margin_bytes: u64,
    pub usable_bytes: u64,
    pub weights_bytes: u64,
    pub kv_bytes: u64,
    pub compute_bytes: u64,
    /// weights + kv + compute on the device.
    pub planned_bytes: u64,
}

/// How a plan divides between host and device: weights, KV bytes per token on each side.
pub(super) struct Split<'a> {
    pub(super) offload: Option<&'a Offload>,
    pub(super) host_weights: u64,
    pub(super) device_weights: u64,
    pub(super) kv_host_per_token: u64,
    pub(super) kv_device_per_token: u64,
    pub(super) device_budget: u64,
    pub(super) device_margin: u64,
    pub(super) layers: u64,
    pub(super) n_layer: u64,
}

impl<'a> Split<'a> {
    pub(super) fn new(req: &'a PlanRequest, kv_bytes_per_token: u64) -> Split<'a> {
        let n_layer = req.shape.n_layer.max(1);
        let offload = req.offload.as_ref().filter(|o| o.layers > 0);
        let layers = offload.map_or(0, |o| o.layers.min(n_layer));
        let device_weights = offload.map_or(0, |o| o.weights_bytes.min(req.weights_bytes));
        // KV cells are per layer: the offloaded layers keep theirs on the device
        let kv_device_per_token = kv_bytes_per_token * layers / n_layer;
        let device_budget = offload.map_or(0, |o| match o.budget {
            Budget::Bytes(b) => b,
            Budget::Fraction(f) => (o.device.free_bytes as f64 * f) as u64,
        });
        // llama.cpp puts an adapter's tensors in the buffer of the weights they adapt: the
        // offloaded layers' share of the adapters is on the device (every layer adapted alike)
        let adapter_device = (u128::from(req.adapter_bytes) * u128::from(layers))
            .div_ceil(u128::from(n_layer)) as u64;
        // the draft model is on the host, its KV too
        let draft_weights = req.draft.map_or(0, |d| d.weights_bytes);
        Split {
            offload,
            host_weights: req.weights_bytes - device_weights + req.adapter_bytes - adapter_device
                + draft_weights,
            device_weights: device_weights + adapter_device,
            kv_host_per_token: kv_bytes_per_token - kv_device_per_token
                + req.draft_kv_bytes_per_token(),
            kv_device_per_token,
            device_budget,
            device_margin: (device_budget as f64 * req.margin.clamp(0.0, 0.9)) as u64,
            layers,
            n_layer,
        }
    }

    /// The most KV cells both sides hold: the host (weights, prefix store, its KV share, and the
    /// compute buffers unless they are on the device) and the device (weights, KV, compute).
    pub(super) fn cells_that_fit(
        &self,
        req: &PlanRequest,
        usable: u64,
        prefix_store: u64,
        slots: u64,
    ) -> u64 {
        let on_device = self.offload.is_some();
        let host_fixed_compute = if on_device { req.compute(slots, 0) } else { 0 };
        let host = cells_within(
            req,
            usable,
            self.host_weights + prefix_store + host_fixed_compute,
            self.kv_host_per_token,
            !on_device,
            slots,
        );
        if !on_device {
            return host;
        }
        let device = cells_within(
            req,
            self.device_budget - self.device_margin,
            self.device_weights,
            self.kv_device_per_token,
            true,
            slots,
        );
        host.min(device)
    }

    pub(super) fn device_plan(&self, kv_cells: u64, compute_bytes: u64) -> Option<DevicePlan> {
        let o = self.offload?;
        let kv_bytes = kv_cells * self.kv_device_per_token;
        Some(DevicePlan {
            name: o.device.name.clone(),
            backend: o.device.backend.clone(),
            total_bytes: o.device.total_bytes,
            free_bytes: o.device.free_bytes,
            used_before_bytes: o.device.used_bytes(),
            layers_offloaded: self.layers,
            n_layer: self.n_layer,
            budget_bytes: self.device_budget,
            margin_bytes: self.device_margin,
            usable_bytes: self.device_budget - self.device_margin,
            weights_bytes: self.device_weights,
            kv_bytes,
            compute_bytes,
            planned_bytes: self.device_weights + kv_bytes + compute_bytes,
        })
    }
}

/// The most KV cells such that `fixed` + cells × `per_cell` (+ the compute buffers when
/// `with_compute`, which grow with the cells) stays within `usable`.
fn cells_within(
    req: &PlanRequest,
    usable: u64,
    fixed: u64,
    per_cell: u64,
    with_compute: bool,
    slots: u64,
) -> u64 {
    let c = |cells| {
        if with_compute {
            req.compute(slots, cells)
        } else {
            0
        }
    };
    let fixed_compute = c(0);
    let per_cell_compute = c(1) - fixed_compute;
    let room = usable.saturating_sub(fixed + fixed_compute);
    let mut fit = room
        .checked_div(per_cell + per_cell_compute)
        .unwrap_or(u64::MAX);
    if with_compute && req.flash_attention {
        // the flash-attention scratch stops growing at 4096 cells
        let room2 = usable.saturating_sub(fixed + c(4096));
        fit = fit.max(room2.checked_div(per_cell).unwrap_or(u64::MAX));
    }
    fit
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::gguf::ModelShape;
    use crate::plan::{KvType, MemoryPlan};

    /// The default model's shape (SmolLM2-135M), for the plan's tests.
    pub(in crate::plan) fn smollm2_shape() -> ModelShape {
        ModelShape {
            n_layer: 30,
            n_head: 9,
            n_head_kv: 3,
            n_embd: 576,
            head_dim_k: 64,
            head_dim_v: 64,
            n_vocab: 49152,
            n_ctx_train: 8192,
        }
    }

    /// The default model's shape, `layers` of its 30 offloaded, `adapters` bytes of LoRA tensors.
    fn plan(layers: u64, adapters: u64) -> MemoryPlan {
        let weights = 96_600_000;
        MemoryPlan::new(&PlanRequest {
            weights_bytes: weights,
            adapter_bytes: adapters,
            shape: smollm2_shape(),
            kv_type: KvType::F16,
            memory_total: 8 << 30,
            budget: Budget::Bytes(2 << 30),
            margin: 0.1,
            context: 512,
            n_batch: 512,
            max_sequences: 8,
            kv_cells_cap: Some(4096),
            flash_attention: true,
            kv_unified: false,
            prefix_store: Some(0),
            lanes: 1,
            draft: None,
            offload: Some(Offload {
                device: DeviceMemory {
                    name: "Fake0".into(),
                    description: "a fake device".into(),
                    backend: "Fake".into(),
                    total_bytes: 8 << 30,
                    free_bytes: 8 << 30,
                },
                budget: Budget::Bytes(2 << 30),
                layers,
                weights_bytes: weights * layers / 30,
            }),
        })
    }

    /// llama.cpp allocates an adapter tensor in the buffer of the weight it adapts: the
    /// offloaded layers' share of the adapters is planned on the device, the rest on the host.
    #[test]
    fn adapters_are_planned_where_the_layers_they_adapt_are() {
        let adapters = 19_537_920;
        for (layers, on_device) in [(30, adapters), (0, 0), (15, adapters / 2), (7, 4_558_848)] {
            let (without, with) = (plan(layers, 0), plan(layers, adapters));
            assert_eq!(with.kv_cells, without.kv_cells);
            let device = |p: &MemoryPlan| p.device.as_ref().map_or(0, |d| d.weights_bytes);
            assert_eq!(
                device(&with) - device(&without),
                on_device,
                "{layers} layers"
            );
            assert_eq!(
                with.host_planned_bytes - without.host_planned_bytes,
                adapters - on_device,
                "{layers} layers"
            );
        }
    }
}
