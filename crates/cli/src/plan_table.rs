//! The rows of `abserve plan`'s table (label, value), for one model's plan: what `cmd_plan`
//! prints for one model and `cmd_plan_models` for each of several.

use abserve_engine::plan::{human_bytes, MemoryPlan};

/// `bytes` for people and exactly, with a note: "1.2 MB (1234567 B; note)".
fn sized(bytes: u64, note: &str) -> String {
    format!("{} ({bytes} B{note})", human_bytes(bytes))
}

/// The plan's lines about the model and host memory, as (label, value).
pub(crate) fn host_rows(plan: &MemoryPlan, source: String) -> Vec<(&'static str, String)> {
    let s = &plan.shape;
    vec![
        ("model", source),
        (
            "shape",
            format!(
                "{} layers, {} heads, {} KV heads, head dim {}",
                s.n_layer, s.n_head, s.n_head_kv, s.head_dim_k
            ),
        ),
        ("weights", sized(plan.weights_bytes, "")),
        (
            "adapters",
            sized(plan.adapter_bytes, "; LoRA tensors, beside the weights"),
        ),
        (
            "draft model",
            sized(
                plan.draft_weights_bytes,
                &format!(
                    "; --draft-model, on the host; its KV {} B per token of the kv",
                    plan.draft_kv_bytes_per_token
                ),
            ),
        ),
        (
            "kv per token",
            format!("{} B ({})", plan.kv_bytes_per_token, plan.kv_type),
        ),
        ("compute buffers", human_bytes(plan.compute_bytes)),
        ("prefix store", human_bytes(plan.prefix_store_bytes)),
        ("budget", sized(plan.budget_bytes, "")),
        ("margin", human_bytes(plan.margin_bytes)),
        ("usable", human_bytes(plan.usable_bytes)),
        (
            "kv cache",
            format!("{} tokens = {}", plan.kv_cells, human_bytes(plan.kv_bytes)),
        ),
        (
            "kv layout",
            if plan.kv_unified {
                "one unified pool shared by all sequences".to_string()
            } else {
                format!(
                    "{} slots × {} cells (one stream per slot)",
                    plan.seq_slots, plan.kv_cells_per_slot
                )
            },
        ),
        ("planned total", human_bytes(plan.planned_bytes)),
        (
            "planned on the host",
            format!(
                "{} ({} B)",
                human_bytes(plan.host_planned_bytes),
                plan.host_planned_bytes
            ),
        ),
        ("context per sequence", format!("{} tokens", plan.context)),
        (
            "full-context sequences",
            plan.full_context_sequences.to_string(),
        ),
        ("model copies that fit", plan.copies_that_fit.to_string()),
        ("fits", if plan.fits { "yes".into() } else { "NO".into() }),
    ]
}

/// The device part of the table, when layers are offloaded.
pub(crate) fn device_rows(plan: &MemoryPlan) -> Vec<(&'static str, String)> {
    let Some(d) = &plan.device else { return vec![] };
    vec![
        (
            "device",
            format!(
                "{} ({}), {} free of {}",
                d.name,
                d.backend,
                human_bytes(d.free_bytes),
                human_bytes(d.total_bytes)
            ),
        ),
        (
            "layers offloaded",
            format!("{} of {}", d.layers_offloaded, d.n_layer),
        ),
        (
            "device budget",
            format!(
                "{} ({} B), margin {}",
                human_bytes(d.budget_bytes),
                d.budget_bytes,
                human_bytes(d.margin_bytes)
            ),
        ),
        ("device weights", human_bytes(d.weights_bytes)),
        ("device kv", human_bytes(d.kv_bytes)),
        ("device compute", human_bytes(d.compute_bytes)),
        (
            "planned on the device",
            format!("{} ({} B)", human_bytes(d.planned_bytes), d.planned_bytes),
        ),
    ]
}
