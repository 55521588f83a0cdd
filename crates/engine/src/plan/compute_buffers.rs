//! The compute reservation: llama.cpp's compute and output buffers, bounded from the model's
//! shape (not measured), per context, and the runtime's allowance once per process.

use crate::gguf::ModelShape;

/// Compute buffers as llama.cpp sizes them on CPU: the graph's largest live activations for one
/// micro-batch, dominated by the logits rows (n_batch × n_vocab f32) and the per-layer
/// activations; the attention scores (without flash attention a full n_batch × kv_cells × n_head
/// f32 matrix, with it a small tiled scratch); the output buffer for one logits row per
/// sequence; and a fixed allowance for the runtime (threads, tokenizer tables, allocator slack).
pub fn compute_estimate(
    shape: &ModelShape,
    n_batch: u64,
    seq_slots: u64,
    kv_cells: u64,
    flash_attention: bool,
) -> u64 {
    let logits_graph = n_batch * shape.n_vocab * 4;
    let ff = 4 * shape.n_embd; // typical FFN width; activations are a handful of these rows
    let activations = n_batch * (6 * shape.n_embd + 3 * ff) * 4;
    let attn = if flash_attention {
        n_batch * shape.n_head * 4 * kv_cells.min(4096) / 8
    } else {
        n_batch * shape.n_head * 4 * kv_cells
    };
    let outputs = seq_slots.max(1) * shape.n_vocab * 4;
    logits_graph + activations + attn + outputs + COMPUTE_RUNTIME_BYTES
}

/// The part of [`compute_estimate`] that is the process's, not a context's: threads, tokenizer
/// tables, allocator slack (counted once however many contexts there are).
pub const COMPUTE_RUNTIME_BYTES: u64 = 48 << 20;

/// [`compute_estimate`] for `lanes` contexts that divide `seq_slots` and `kv_cells` between
/// them: each has the compute buffers of a micro-batch of its own (the largest lane's share of
/// the slots and cells, counted for every lane); the runtime allowance is the process's, once.
pub fn lanes_compute(
    shape: &ModelShape,
    n_batch: u64,
    lanes: u64,
    seq_slots: u64,
    kv_cells: u64,
    flash_attention: bool,
) -> u64 {
    let lanes = lanes.clamp(1, seq_slots.max(1));
    let one = compute_estimate(
        shape,
        n_batch,
        seq_slots.div_ceil(lanes),
        kv_cells.div_ceil(lanes),
        flash_attention,
    );
    lanes * (one - COMPUTE_RUNTIME_BYTES) + COMPUTE_RUNTIME_BYTES
}
