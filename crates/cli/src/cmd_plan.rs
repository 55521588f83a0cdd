//! `abserve plan`: the memory plan as a table or JSON, from a GGUF header or from hypothetical
//! numbers, without loading any weights.

use abserve_engine::gguf::ModelShape;
use abserve_engine::plan::{human_bytes, parse_bytes, Budget, MemoryPlan, PlanRequest};
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
    /// Memory of the device the model would run on (`96GiB`) instead of this machine's.
    #[arg(long, value_parser = parse_bytes)]
    pub device_memory: Option<u64>,
}

/// The plan of a model that is described by flags instead of a GGUF file.
fn hypothetical(a: &PlanArgs, cfg: &EngineConfig, w: u64) -> anyhow::Result<MemoryPlan> {
    let (layers, kv_heads, head_dim) = (a.layers.unwrap(), a.kv_heads.unwrap(), a.head_dim.unwrap());
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
        shape,
        kv_type: cfg.kv_type,
        memory_total: cfg.memory_total.unwrap_or_else(abserve_engine::plan::available_memory),
        budget: cfg.budget,
        margin: cfg.margin,
        context: cfg.context,
        n_batch: cfg.n_batch,
        max_sequences: cfg.max_sequences,
        kv_cells_cap: cfg.kv_cells_cap,
        flash_attention: cfg.flash_attention,
        kv_unified: cfg.kv_unified,
        prefix_store: cfg.prefix_store,
    }))
}

pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    let mut cfg = a.model.engine_config()?;
    if let Some(d) = a.device_memory {
        cfg.memory_total = Some(d);
        cfg.budget = a.model.memory_budget.unwrap_or(Budget::Fraction(1.0));
    }
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
    let s = &plan.shape;
    let rows: Vec<(&str, String)> = vec![
        ("model", source),
        ("shape", format!("{} layers, {} heads, {} KV heads, head dim {}", s.n_layer, s.n_head, s.n_head_kv, s.head_dim_k)),
        ("weights", format!("{} ({} B)", human_bytes(plan.weights_bytes), plan.weights_bytes)),
        ("kv per token", format!("{} B ({})", plan.kv_bytes_per_token, plan.kv_type)),
        ("compute buffers", human_bytes(plan.compute_bytes)),
        ("prefix store", human_bytes(plan.prefix_store_bytes)),
        ("budget", format!("{} ({} B)", human_bytes(plan.budget_bytes), plan.budget_bytes)),
        ("margin", human_bytes(plan.margin_bytes)),
        ("usable", human_bytes(plan.usable_bytes)),
        ("kv cache", format!("{} tokens = {}", plan.kv_cells, human_bytes(plan.kv_bytes))),
        (
            "kv layout",
            if plan.kv_unified {
                "one unified pool shared by all sequences".to_string()
            } else {
                format!("{} slots × {} cells (one stream per slot)", plan.seq_slots, plan.kv_cells_per_slot)
            },
        ),
        ("planned total", human_bytes(plan.planned_bytes)),
        ("context per sequence", format!("{} tokens", plan.context)),
        ("full-context sequences", plan.full_context_sequences.to_string()),
        ("model copies that fit", plan.copies_that_fit.to_string()),
        ("fits", if plan.fits { "yes".into() } else { "NO".into() }),
    ];
    for (k, v) in rows {
        println!("{k:<26} {v}");
    }
    if let Err(e) = plan.check_fits() {
        println!("\n{e}");
    }
    Ok(())
}
