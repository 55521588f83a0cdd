//! `abserve plan`: the memory plan as a table or JSON, from a GGUF header or from hypothetical
//! numbers, without loading any weights.

use abserve_engine::gguf::ModelShape;
use std::sync::Arc;

use abserve_engine::device::FakeDevice;
use abserve_engine::plan::{Budget, MemoryPlan, Offload, PlanRequest};
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
        lanes: cfg.adapter_lanes,
        draft: None,
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

pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    if a.model.model.len() > 1 {
        if a.weights_bytes.is_some() {
            anyhow::bail!(
                "a hypothetical model (--weights-bytes) is planned alone: give one --model"
            );
        }
        let models = a.model.models_sharing(|cfg| what_if_device(&a, cfg))?;
        return crate::cmd_plan_models::run(models, a.json);
    }
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
    let rows = crate::plan_table::host_rows(&plan, source);
    for (k, v) in rows
        .into_iter()
        .chain(crate::plan_table::device_rows(&plan))
    {
        println!("{k:<26} {v}");
    }
    if let Err(e) = plan.check_fits() {
        println!("\n{e}");
    }
    Ok(())
}
