//! Flags shared by every subcommand that loads a model, turned into an `EngineConfig`.

use std::path::PathBuf;

use abserve_engine::models::ModelConfig;
use abserve_engine::plan::{Budget, KvType};
use abserve_engine::{DeviceHandle, EngineConfig, GpuLayers};
use clap::Args;

pub const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file, or `ID=FILE` to name it. `serve` and `plan` take several (repeat the
    /// flag): each is loaded once, requests and variants name one by its id, the first is the
    /// default, and the memory budget is divided between them (docs/adapters.md).
    #[arg(long, env = "ABSERVE_MODEL", default_value = DEFAULT_MODEL)]
    pub model: Vec<String>,
    /// `ID=N`: model ID's weight in the division of the budget between several models (what
    /// their weights and adapters leave is divided in proportion; default 1 each, equal parts).
    /// Repeatable.
    #[arg(long)]
    pub model_share: Vec<String>,
    /// Host memory budget: bytes (`2GiB`, `512MB`) or a share of available memory (`50%`)
    /// [default: 2GiB].
    #[arg(long, value_parser = parse_budget)]
    pub memory_budget: Option<Budget>,
    /// Share of the budget kept free, in percent.
    #[arg(long, default_value_t = 10.0)]
    pub margin: f64,
    /// Per-sequence context in tokens (prompt + output).
    #[arg(long, default_value_t = 2048)]
    pub context: u64,
    /// KV cache element type: f16 or q8_0.
    #[arg(long, default_value = "f16")]
    pub kv_type: KvType,
    /// Most sequences in flight at once (llama.cpp's n_seq_max, at most 256).
    #[arg(long, default_value_t = 64)]
    pub max_sequences: u64,
    /// Never allocate more KV cells than this, whatever the budget allows (`--kv-tokens`, its
    /// old name, still works).
    #[arg(long, alias = "kv-tokens")]
    pub kv_cells: Option<u64>,
    /// Prefill chunk size (tokens per engine step).
    #[arg(long, default_value_t = 512)]
    pub batch: u64,
    /// llama.cpp's flash attention: on (default) or off. Off makes the compute buffer grow
    /// with the KV cache.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub flash_attn: String,
    /// Structured outputs: append the tokens a grammar forces (keys, punctuation) without
    /// sampling them, computed together like a prompt chunk: on (default) or off (one per step;
    /// the same tokens, more steps).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub fast_forward: String,
    /// Speculative decoding by prompt lookup: a sequence whose last tokens occurred earlier in
    /// its prompt or output drafts what followed them there, verified in the same batch; used
    /// per sequence while its measured acceptance pays and per step while steps with drafts
    /// give more tokens/s than without. Output is unchanged (greedy identical, sampled equally
    /// distributed). on (default), off, or always (drafts whenever the sequence's acceptance
    /// allows, without the throughput check: for devices where a few more tokens per step cost
    /// next to nothing).
    #[arg(long, default_value = "on", value_parser = ["on", "off", "always"])]
    pub speculative: String,
    /// A draft model for speculative decoding: a smaller GGUF with the model's vocabulary (e.g.
    /// its first layers: self-speculation), for the first `--model`. It drafts greedily where
    /// prompt lookup finds nothing, on the host, verified in the same batch (output unchanged),
    /// and the memory plan counts its weights, KV and compute.
    #[arg(long, value_name = "GGUF")]
    pub draft_model: Option<std::path::PathBuf>,
    /// CPU threads for llama.cpp (default: all cores).
    #[arg(long)]
    pub threads: Option<i32>,
    /// One KV pool shared by all sequences (cells borrowed between short and long sequences,
    /// prefixes shared without copies) instead of one stream per slot (each token attends only to
    /// its own sequence; the default, faster under concurrency).
    #[arg(long)]
    pub kv_unified: bool,
    /// Inter-token latency target in milliseconds: another decoding sequence is admitted only
    /// while the measured step time stays under it, unless the extra sequence adds real
    /// throughput (>= 5%). 0 (the default) turns it off: on the measured A/B workload a 60 ms
    /// target cost 22% of the tokens/s (docs/benchmarks.md).
    #[arg(long, default_value_t = 0.0)]
    pub max_itl_ms: f64,
    /// Host memory for saved prompt prefixes (llama.cpp sequence states restorable into any
    /// slot), taken from the budget: bytes (`64MiB`) or 0 for none [default: 5% of the budget;
    /// none with --kv-unified].
    #[arg(long, value_parser = abserve_engine::plan::parse_bytes)]
    pub prefix_store: Option<u64>,
    /// Layers to offload to the GPU: a number or `all` [default: all when the build has a GPU
    /// device (CUDA or Vulkan), else 0].
    #[arg(long)]
    pub gpu_layers: Option<GpuLayers>,
    /// The GPU to offload to, by name (`abserve devices` lists them) [default: the first].
    #[arg(long)]
    pub device: Option<String>,
    /// Device memory budget: bytes, or a share of the device's free memory (`90%`) [default:
    /// 100%, less --margin]. `abserve plan` without a GPU takes bytes here as a hypothetical
    /// device of that size.
    #[arg(long, value_parser = parse_budget)]
    pub device_memory: Option<Budget>,
    /// A LoRA adapter (GGUF LoRA file) to load at start, counted in the memory plan; requests
    /// and variants name it in `adapters` (repeatable).
    #[arg(long = "lora")]
    pub lora: Vec<PathBuf>,
    /// A folder of GGUF LoRA files that requests and variants may name (loaded on first use,
    /// within --adapter-memory).
    #[arg(long)]
    pub adapter_dir: Option<PathBuf>,
    /// Memory reserved in the plan for adapters loaded after start (from --adapter-dir):
    /// bytes (`64MiB`) [default: 0].
    #[arg(long, value_parser = abserve_engine::plan::parse_bytes, default_value = "0")]
    pub adapter_memory: u64,
    /// With sequences of several adapter sets running: steps one set keeps the context before
    /// the next set's sequences run (applying another set rebuilds llama.cpp's compute graphs);
    /// 0 runs every set in every step.
    #[arg(long, default_value_t = 8)]
    pub adapter_turn: usize,
    /// llama.cpp contexts on the one model that divide the slots between them; each applies its
    /// own adapter set and they decode side by side, so sequences of different sets need no
    /// turns. Each lane has compute buffers of its own (the plan counts them): pair with a small
    /// --batch (e.g. 64). Split KV streams only.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub adapter_lanes: u64,
}

pub fn parse_budget(s: &str) -> Result<Budget, String> {
    s.parse()
}

impl ModelArgs {
    /// The one model of a command that runs one (`generate`).
    pub fn engine_config(&self) -> anyhow::Result<EngineConfig> {
        let mut models = self.model_configs()?;
        if models.len() > 1 {
            anyhow::bail!(
                "this command runs one model; several --model flags are for serve, plan, eval and worker"
            );
        }
        Ok(models.remove(0).config)
    }

    /// Every `--model`, by id, with the memory budget divided between them (`models.rs`):
    /// each model's budget and device budget are its share, in bytes.
    pub fn model_configs(&self) -> anyhow::Result<Vec<ModelConfig>> {
        let mut models = self.models_sharing(|_| Ok(()))?;
        if models.len() > 1 {
            abserve_engine::models::divide_budget(&mut models)?;
        }
        Ok(models)
    }

    /// Every `--model`, by id, each still with the whole budget (`adjust` may change the
    /// settings they share first: `plan`'s hypothetical device).
    pub fn models_sharing(
        &self,
        adjust: impl FnOnce(&mut EngineConfig) -> anyhow::Result<()>,
    ) -> anyhow::Result<Vec<ModelConfig>> {
        let mut base = self.base_config()?;
        adjust(&mut base)?;
        let mut models = self
            .model
            .iter()
            .map(|spec| ModelConfig::parse(spec, &base).map_err(|e| anyhow::anyhow!(e)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        ModelConfig::set_shares(&mut models, &self.model_share).map_err(|e| anyhow::anyhow!(e))?;
        // adapters are tensors of one base model's weights, and a draft model drafts for one
        // vocabulary: they belong to the first
        for m in models.iter_mut().skip(1) {
            m.config.draft_model = None;
            m.config.adapters.clear();
            m.config.adapter_dir = None;
            m.config.adapter_memory = 0;
        }
        Ok(models)
    }

    /// The settings every model shares (everything but its file).
    fn base_config(&self) -> anyhow::Result<EngineConfig> {
        if !(0.0..90.0).contains(&self.margin) {
            anyhow::bail!(
                "--margin must be between 0 and 90 percent, got {}",
                self.margin
            );
        }
        if self.context < 16 {
            anyhow::bail!("--context must be at least 16 tokens, got {}", self.context);
        }
        if !(1..=256).contains(&self.max_sequences) {
            anyhow::bail!(
                "--max-sequences must be between 1 and 256, got {}",
                self.max_sequences
            );
        }
        if !(32..=8192).contains(&self.batch) {
            anyhow::bail!("--batch must be between 32 and 8192, got {}", self.batch);
        }
        let mut c = EngineConfig::new(DEFAULT_MODEL);
        c.budget = self.memory_budget.unwrap_or(Budget::Bytes(2 << 30));
        c.margin = self.margin / 100.0;
        c.context = self.context;
        c.kv_type = self.kv_type;
        c.max_sequences = self.max_sequences;
        c.kv_cells_cap = self.kv_cells;
        c.n_batch = self.batch;
        c.flash_attention = self.flash_attn == "on";
        c.fast_forward = self.fast_forward == "on";
        c.speculative = match self.speculative.as_str() {
            "off" => abserve_engine::Speculation::Off,
            "always" => abserve_engine::Speculation::Always,
            _ => abserve_engine::Speculation::Measured,
        };
        c.draft_model = self.draft_model.clone();
        c.kv_unified = self.kv_unified;
        if !(self.max_itl_ms >= 0.0 && self.max_itl_ms.is_finite()) {
            anyhow::bail!(
                "--max-itl-ms must be 0 (off) or a positive number of milliseconds, got {}",
                self.max_itl_ms
            );
        }
        c.max_itl_ms = self.max_itl_ms;
        c.prefix_store = self.prefix_store;
        if let Some(t) = self.threads {
            c.threads = t.max(1);
        }
        c.gpu_layers = self.gpu_layers;
        c.device_budget = self.device_memory.unwrap_or(Budget::Fraction(1.0));
        c.adapters = self.lora.clone();
        c.adapter_dir = self.adapter_dir.clone();
        c.adapter_memory = self.adapter_memory;
        c.adapter_turn = self.adapter_turn;
        c.adapter_lanes = self.adapter_lanes;
        if self.gpu_layers != Some(GpuLayers::Count(0)) {
            // none in a CPU build; the engine refuses --gpu-layers then (`plan` may add a
            // hypothetical device first)
            c.device = abserve_engine::device::find(self.device.as_deref())
                .map_err(|e| anyhow::anyhow!(e))?
                .map(DeviceHandle);
        }
        Ok(c)
    }
}

/// The store a `--store` value names, or the SQLite file in `data_dir` without one.
pub fn store_location(
    store: Option<&str>,
    data_dir: &std::path::Path,
) -> anyhow::Result<abserve_protocol::location::Location> {
    Ok(match store {
        Some(s) => s.parse()?,
        None => abserve_protocol::location::Location::Sqlite(data_dir.join("abserve.db")),
    })
}
