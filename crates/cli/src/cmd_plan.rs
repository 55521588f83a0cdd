//! `abserve plan`: the memory plan as a table or JSON, from a GGUF header or from hypothetical
//! numbers, without loading any weights.

use abserve_engine::gguf::ModelShape;
use std::sync::Arc;

use abserve_engine::device::FakeDevice;
use abserve_engine::plan::{human_bytes, Budget, MemoryPlan, Offload, PlanRequest};
use abserve_engine::DeviceHandle;
use abserve_engine::EngineConfig;
use clap::Args;

use crate::args::ModelArgs;

#[derive(Args, Debug)]
pub struct PlanArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Hypothetical model: bytes of weights (instead of reading --model).
    #[arg(long, requires_all = ["layers", "kv_heads", "head_dim"])]
    pub weights_bytes: Option<u64>,
    /// Hypothetical model: transformer layers.
    #[arg(long)]
    pub layers: Option<u64>,
    /// Hypothetical model: KV heads per layer.
    #[arg(long)]
    pub kv_heads: Option<u64>,
    /// Hypothetical model: dimension of one head.
    #[arg(long)]
    pub head_dim: Option<u64>,
    /// Hypothetical model: attention heads (default: 8 × kv-heads).
    #[arg(long)]
    pub heads: Option<u64>,
    /// Hypothetical model: vocabulary size (sizes the logits buffers).
    #[arg(long, default_value_t = 128256)]
    pub vocab: u64,
}

/// The plan of a model that is described by flags instead of a GGUF file.
fn hypothetical(a: &PlanArgs, cfg: &EngineConfig, w: u64) -> anyhow::Result<MemoryPlan> {
    let (layers, kv_heads, head_dim) =
        (a.layers.unwrap(), a.kv_heads.unwrap(), a.head_dim.unwrap());
    if layers == 0 || kv_heads == 0 || head_dim == 0 {
        anyhow::bail!("--layers, --kv-heads and --head-dim must be positive");
    }
    let heads = a.heads.unwrap_or(kv_heads * 8);
    let shape = ModelShape {
        n_layer: layers,
        n_head: heads,
        n_head_kv: kv_heads,
        n_embd: heads * head_dim,
        head_dim_k: head_dim,
        head_dim_v: head_dim,
        n_vocab: a.vocab,
        n_ctx_train: cfg.context,
    };
    Ok(MemoryPlan::new(&PlanRequest {
        weights_bytes: w,
        adapter_bytes: 0,
        shape,
        kv_type: cfg.kv_type,
        memory_total: cfg
            .memory_total
            .unwrap_or_else(abserve_engine::plan::available_memory),
        budget: cfg.budget,
        margin: cfg.margin,
        context: cfg.context,
        n_batch: cfg.n_batch,
        max_sequences: cfg.max_sequences,
        kv_cells_cap: cfg.kv_cells_cap,
        flash_attention: cfg.flash_attention,
        kv_unified: cfg.kv_unified,
        prefix_store: cfg.prefix_store,
        // without a tensor table the weights are spread evenly over the layers
        offload: cfg.device.as_ref().and_then(|d| {
            let gpu_layers = cfg.offloaded_layers(layers);
            (gpu_layers > 0).then(|| Offload {
                device: d.0.memory(),
                budget: cfg.device_budget,
                layers: gpu_layers.min(layers),
                weights_bytes: if gpu_layers > layers {
                    w
                } else {
                    w / layers * gpu_layers
                },
            })
        }),
    }))
}

/// No GPU here: a device of `--device-memory` bytes answers "what if".
fn what_if_device(a: &PlanArgs, cfg: &mut abserve_engine::EngineConfig) -> anyhow::Result<()> {
    if cfg.device.is_none() && a.model.gpu_layers != Some(abserve_engine::GpuLayers::Count(0)) {
        match a.model.device_memory {
            Some(Budget::Bytes(b)) => {
                cfg.device = Some(DeviceHandle(Arc::new(FakeDevice::hypothetical(b))));
                cfg.device_budget = Budget::Fraction(1.0);
            }
            Some(Budget::Fraction(_)) => anyhow::bail!(
                "this build has no GPU: give --device-memory in bytes for a hypothetical device"
            ),
            None => {}
        }
    }
    Ok(())
}

/// The plan's lines about the model and host memory, as (label, value).
fn host_rows(plan: &MemoryPlan, source: String) -> Vec<(&'static str, String)> {
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
        (
            "weights",
            format!(
                "{} ({} B)",
                human_bytes(plan.weights_bytes),
                plan.weights_bytes
            ),
        ),
        (
            "adapters",
            format!(
                "{} ({} B; LoRA tensors, beside the weights)",
                human_bytes(plan.adapter_bytes),
                plan.adapter_bytes
            ),
        ),
        (
            "kv per token",
            format!("{} B ({})", plan.kv_bytes_per_token, plan.kv_type),
        ),
        ("compute buffers", human_bytes(plan.compute_bytes)),
        ("prefix store", human_bytes(plan.prefix_store_bytes)),
        (
            "budget",
            format!(
                "{} ({} B)",
                human_bytes(plan.budget_bytes),
                plan.budget_bytes
            ),
        ),
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

pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    let mut cfg = a.model.engine_config()?;
    what_if_device(&a, &mut cfg)?;
    let (plan, source) = match a.weights_bytes {
        Some(w) => (hypothetical(&a, &cfg, w)?, "hypothetical".to_string()),
        None => {
            let (_, plan) = cfg.plan()?;
            (plan, cfg.model.display().to_string())
        }
    };
    if a.json {
        let mut v = serde_json::to_value(&plan)?;
        v["model"] = serde_json::Value::String(source);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let rows = host_rows(&plan, source);
    for (k, v) in rows.into_iter().chain(device_rows(&plan)) {
        println!("{k:<26} {v}");
    }
    if let Err(e) = plan.check_fits() {
        println!("\n{e}");
    }
    Ok(())
}

/// The device part of the table, when layers are offloaded.
fn device_rows(plan: &MemoryPlan) -> Vec<(&'static str, String)> {
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
