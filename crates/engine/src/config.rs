//! What an engine is started with ([`EngineConfig`]: the model, the memory budget, the context,
//! the KV layout, the queue bound, the device and its layers) and the memory plan it implies,
//! made from the GGUF header alone before anything is loaded ([`EngineConfig::plan`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::device::Device;
use crate::gguf::{GgufError, GgufHeader, ModelShape};
use crate::plan::{
    available_memory, Budget, DoesNotFit, DraftRequest, KvType, MemoryPlan, Offload, PlanRequest,
};
use crate::scheduler::{SchedulerConfig, Speculation};

/// How many requests may wait beyond the running slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueLimit {
    /// Callers that bound their own concurrency (generate, eval).
    Unbounded,
    Fixed(usize),
    /// This many per sequence slot of the plan (serve's default: 2).
    PerSlot(usize),
}

impl QueueLimit {
    pub fn resolve(self, slots: usize) -> usize {
        match self {
            QueueLimit::Unbounded => usize::MAX,
            QueueLimit::Fixed(n) => n,
            QueueLimit::PerSlot(k) => k.saturating_mul(slots),
        }
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model: PathBuf,
    pub budget: Budget,
    pub margin: f64,
    /// Per-sequence context in tokens.
    pub context: u64,
    /// Prefill chunk / tokens per llama_decode.
    pub n_batch: u64,
    pub max_sequences: u64,
    pub kv_type: KvType,
    /// Cap on KV cells regardless of budget (tests keep the cache small with it).
    pub kv_cells_cap: Option<u64>,
    pub threads: i32,
    /// Requests that may wait beyond the running slots before `submit` answers QueueFull.
    pub max_queue: QueueLimit,
    pub use_mmap: bool,
    /// Test-only off: admit without checking free KV cells (in a unified pool, see `plan`).
    pub admission_control: bool,
    /// Share the KV of common prompt prefixes between sequences.
    pub prefix_sharing: bool,
    /// llama.cpp's flash attention (on by default, as llama.cpp's server resolves "auto" on a
    /// CPU). Without it the compute buffer grows with the KV cache (a full attention-score
    /// matrix per micro-batch).
    pub flash_attention: bool,
    /// Memory the budget is a share of; `None` means this machine's available memory.
    pub memory_total: Option<u64>,
    /// One KV pool for every sequence instead of one stream per slot (see docs/engine.md).
    pub kv_unified: bool,
    /// Inter-token latency target: one more decoding sequence is not admitted when the measured
    /// step time would pass it and the extra sequence would add little throughput. 0: off.
    pub max_itl_ms: f64,
    /// Host-memory prefix store bytes (`None`: 5% of the budget with split streams; 0: off).
    pub prefix_store: Option<u64>,
    /// Append the tokens a grammar forces without sampling them (structured outputs).
    pub fast_forward: bool,
    /// Speculative decoding by prompt lookup, per sequence where its measured acceptance pays
    /// (see docs/engine.md).
    pub speculative: Speculation,
    /// A draft model for speculative decoding (`--draft-model`): a smaller GGUF with the same
    /// vocabulary (e.g. the model's first layers), drafting where prompt lookup finds nothing.
    /// On the host, counted in the plan (weights, KV per cell, compute).
    pub draft_model: Option<PathBuf>,
    /// The device layers are offloaded to (a GPU of a CUDA or Vulkan build, or a fake in tests);
    /// `None`: everything on the host.
    pub device: Option<DeviceHandle>,
    /// Layers to offload when there is a device (`None`: all of them).
    pub gpu_layers: Option<GpuLayers>,
    /// The device budget: bytes, or a share of the device's free memory (default all of it,
    /// less the margin).
    pub device_budget: Budget,
    /// LoRA adapters loaded at start (`--lora`): requests and variants may name them.
    pub adapters: Vec<PathBuf>,
    /// A folder whose GGUF LoRA files requests and variants may name (`--adapter-dir`).
    pub adapter_dir: Option<PathBuf>,
    /// Memory reserved in the plan for adapters beyond those loaded at start
    /// (`--adapter-memory`; default 0).
    pub adapter_memory: u64,
    /// Steps an adapter set keeps the context while other sets' sequences wait
    /// (`--adapter-turn`; `scheduler/step.rs`).
    pub adapter_turn: usize,
    /// llama.cpp contexts on the one model that divide the slots between them, each applying
    /// its own adapter set, decoded side by side (`--adapter-lanes`; `lane_split.rs`); 1: one
    /// context whose set is switched in turns. Split KV streams only.
    pub adapter_lanes: u64,
}

/// How many layers go to the device (`--gpu-layers N|all`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuLayers {
    All,
    Count(u64),
}

impl std::str::FromStr for GpuLayers {
    type Err = String;
    fn from_str(s: &str) -> Result<GpuLayers, String> {
        match s {
            "all" => Ok(GpuLayers::All),
            n => n
                .parse()
                .map(GpuLayers::Count)
                .map_err(|_| format!("--gpu-layers takes a number or 'all', not '{s}'")),
        }
    }
}

/// A shared device, printable in a config.
#[derive(Clone)]
pub struct DeviceHandle(pub Arc<dyn Device>);

impl std::fmt::Debug for DeviceHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.0.memory().name)
    }
}

impl EngineConfig {
    pub fn new(model: impl Into<PathBuf>) -> Self {
        EngineConfig {
            model: model.into(),
            budget: Budget::Bytes(2 << 30),
            margin: 0.10,
            context: 2048,
            n_batch: 512,
            max_sequences: 64,
            kv_type: KvType::F16,
            kv_cells_cap: None,
            threads: std::thread::available_parallelism()
                .map(|n| n.get() as i32)
                .unwrap_or(2),
            max_queue: QueueLimit::Unbounded,
            use_mmap: true,
            admission_control: true,
            prefix_sharing: true,
            flash_attention: true,
            memory_total: None,
            kv_unified: false,
            max_itl_ms: 0.0,
            prefix_store: None,
            fast_forward: true,
            speculative: Speculation::Measured,
            draft_model: None,
            device: None,
            gpu_layers: None,
            device_budget: Budget::Fraction(1.0),
            adapters: Vec::new(),
            adapter_dir: None,
            adapter_memory: 0,
            adapter_turn: 8,
            adapter_lanes: 1,
        }
    }

    /// Transformer layers offloaded: 0 without a device; `n_layer + 1` for all (the output layer
    /// too, as llama.cpp counts it).
    pub fn offloaded_layers(&self, n_layer: u64) -> u64 {
        match (&self.device, self.gpu_layers) {
            (None, _) => 0,
            (Some(_), None | Some(GpuLayers::All)) => n_layer + 1,
            (Some(_), Some(GpuLayers::Count(n))) => n.min(n_layer + 1),
        }
    }

    /// Reads the header and makes the plan; loads nothing.
    /// The device part of the plan's request: the device's memory now, the offloaded layers and
    /// their weights from the tensor table.
    fn offload(&self, header: &GgufHeader, shape: &ModelShape) -> Option<Offload> {
        let device = self.device.as_ref()?;
        let gpu_layers = self.offloaded_layers(shape.n_layer);
        (gpu_layers > 0).then(|| Offload {
            device: device.0.memory(),
            budget: self.device_budget,
            layers: gpu_layers.min(shape.n_layer),
            weights_bytes: header.offloaded_bytes(shape.n_layer, gpu_layers),
        })
    }

    /// The scheduler's settings under `plan`: its cells, slots and context, the KV layout, the
    /// prefix store, the ITL target and the switches.
    pub(crate) fn scheduler_config(&self, plan: &MemoryPlan) -> SchedulerConfig {
        let mut s = SchedulerConfig::new(
            plan.kv_cells as usize,
            plan.seq_slots as usize,
            plan.context as usize,
        );
        if !plan.kv_unified {
            s.cells_per_slot = Some(plan.kv_cells_per_slot as usize);
        }
        s.prefix_store_bytes = plan.prefix_store_bytes as usize;
        s.max_itl = (self.max_itl_ms > 0.0).then(|| Duration::from_secs_f64(self.max_itl_ms / 1e3));
        s.admission_control = self.admission_control;
        s.fast_forward = self.fast_forward;
        // draft rows are bit-identical to one-token decodes only on flash attention's per-row
        // path (without it a sequence's several rows take other kernels: docs/engine.md)
        s.speculative = match self.flash_attention {
            true => self.speculative,
            false => Speculation::Off,
        };
        s.adapter_turn = self.adapter_turn;
        s.lanes = plan.lanes as usize;
        if !self.prefix_sharing {
            s.min_shared_prefix = usize::MAX;
        }
        s
    }

    /// The draft model's part of the plan, checked against the model's `shape`: the same
    /// vocabulary size (the tokens themselves are compared when it loads), and no device (the
    /// draft runs on the host).
    fn draft(&self, shape: &ModelShape) -> Result<Option<DraftRequest>, EngineError> {
        let Some(path) = &self.draft_model else {
            return Ok(None);
        };
        let bad = |why: String| EngineError::DraftModel(format!("{}: {why}", path.display()));
        if self.offloaded_layers(shape.n_layer) > 0 {
            return Err(bad(
                "a draft model runs on the host; with layers on a device it is not supported yet"
                    .into(),
            ));
        }
        let header = GgufHeader::read(path).map_err(|e| bad(e.to_string()))?;
        let draft = ModelShape::from_header(&header).map_err(|e| bad(e.to_string()))?;
        if draft.n_vocab != shape.n_vocab {
            return Err(bad(format!(
                "its vocabulary has {} tokens and the model's {}: a draft must share the model's vocabulary",
                draft.n_vocab, shape.n_vocab
            )));
        }
        Ok(Some(DraftRequest {
            weights_bytes: header.weights_bytes(),
            shape: draft,
        }))
    }

    pub fn plan(&self) -> Result<(GgufHeader, MemoryPlan), EngineError> {
        let header = GgufHeader::read(&self.model)?;
        let shape = ModelShape::from_header(&header)?;
        let mut adapter_bytes = self.adapter_memory;
        for a in &self.adapters {
            adapter_bytes += GgufHeader::read(a)?.weights_bytes();
        }
        let plan = MemoryPlan::new(&PlanRequest {
            weights_bytes: header.weights_bytes(),
            adapter_bytes,
            shape,
            kv_type: self.kv_type,
            memory_total: self.memory_total.unwrap_or_else(available_memory),
            budget: self.budget,
            margin: self.margin,
            context: self.context,
            n_batch: self.n_batch,
            max_sequences: self.max_sequences,
            kv_cells_cap: self.kv_cells_cap,
            flash_attention: self.flash_attention,
            // without admission control only a unified pool can run out (a split stream always
            // holds its own sequence), and that is what the switch exists to show
            kv_unified: self.kv_unified || !self.admission_control,
            prefix_store: if self.prefix_sharing {
                self.prefix_store
            } else {
                Some(0)
            },
            lanes: self.adapter_lanes,
            offload: self.offload(&header, &shape),
            draft: self.draft(&shape)?,
        });
        Ok((header, plan))
    }
}

/// Why an engine did not start: its model, its plan, its device or llama.cpp, with the numbers.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("--gpu-layers needs a GPU device, and this build has none (build with --features cuda or vulkan; `abserve devices` lists what it has)")]
    NoDevice,
    #[error(transparent)]
    DoesNotFit(#[from] DoesNotFit),
    #[error(transparent)]
    Llama(#[from] crate::llama::LlamaError),
    #[error("engine thread failed to start: {0}")]
    Thread(String),
    #[error("adapter: {0}")]
    Adapter(String),
    /// Several models whose budget shares do not fit (`models.rs`), with every number.
    #[error("{0}")]
    Models(String),
    #[error("--adapter-lanes {0} needs split KV streams: each lane is a context of its own slots, and a unified cache is one pool for every slot (drop --kv-unified or use one lane)")]
    LanesNeedSplitStreams(u64),
    #[error("--draft-model {0}")]
    DraftModel(String),
    #[error("--context {context} is longer than the model's training context of {train} tokens")]
    ContextTooLong { context: u64, train: u64 },
}
