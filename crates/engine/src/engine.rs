//! The engine: plan memory, load the model once, and run the scheduler on one dedicated thread
//! that alone owns the llama.cpp context. Everything else holds an [`Engine`] handle and talks
//! to that thread through a channel (validation → queue → scheduler → backend).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use abserve_protocol::Sampling;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde::Serialize;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::backend::{take_buffer_log, Context, ContextConfig, LlamaBuffers, Model};
use crate::chat::{ChatMessage, ChatTemplate, ChatTemplateError};
use crate::device::Device;
use crate::gguf::{GgufError, GgufHeader, ModelShape};
use crate::plan::{
    available_memory, current_rss, human_bytes, Budget, DoesNotFit, KvType, MemoryPlan, Offload,
    PlanRequest,
};
use crate::prepare::{self, Input, Limits, Options, PrepareError, Prepared, Tokenizer};
use crate::request::{Event, Request, SubmitError};
use crate::scheduler::{
    Compute, EngineStats, Scheduler, SchedulerConfig, StatsSnapshot, StepObserver,
};

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
    /// The device layers are offloaded to (a GPU of a CUDA or Vulkan build, or a fake in tests);
    /// `None`: everything on the host.
    pub device: Option<DeviceHandle>,
    /// Layers to offload when there is a device (`None`: all of them).
    pub gpu_layers: Option<GpuLayers>,
    /// The device budget: bytes, or a share of the device's free memory (default all of it,
    /// less the margin).
    pub device_budget: Budget,
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
            device: None,
            gpu_layers: None,
            device_budget: Budget::Fraction(1.0),
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

    pub fn plan(&self) -> Result<(GgufHeader, MemoryPlan), EngineError> {
        let header = GgufHeader::read(&self.model)?;
        let shape = ModelShape::from_header(&header)?;
        let plan = MemoryPlan::new(&PlanRequest {
            weights_bytes: header.weights_bytes(),
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
            offload: self.offload(&header, &shape),
        });
        Ok((header, plan))
    }
}

/// What llama.cpp allocated, beside the plan: resident memory after loading and after the
/// context, its buffers, and the device buffers against the device part of the plan.
fn log_measured(plan: &MemoryPlan, m: &MeasuredMemory) {
    tracing::info!(
        "memory measured: weights rss +{}, context rss +{}; llama.cpp buffers: kv {} (planned {}), compute+output {} (planned {})",
        human_bytes(m.rss_after_load.saturating_sub(m.rss_before_load)),
        human_bytes(m.rss_after_context.saturating_sub(m.rss_after_load)),
        human_bytes(m.llama.kv),
        human_bytes(plan.kv_bytes),
        human_bytes(m.llama.compute + m.llama.output),
        human_bytes(plan.compute_bytes),
    );
    if let Some(d) = &plan.device {
        // what llama.cpp put in device buffers, against the device part of the plan
        if m.llama.device > d.planned_bytes {
            tracing::warn!(
                "device {}: llama.cpp allocated {} in device buffers, above the {} planned: the plan under-estimated",
                d.name, human_bytes(m.llama.device), human_bytes(d.planned_bytes)
            );
        } else {
            tracing::info!(
                "device {}: llama.cpp allocated {} in device buffers (planned {})",
                d.name,
                human_bytes(m.llama.device),
                human_bytes(d.planned_bytes)
            );
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("--gpu-layers needs a GPU device, and this build has none (build with --features cuda or vulkan; `abserve devices` lists what it has)")]
    NoDevice,
    #[error(transparent)]
    DoesNotFit(#[from] DoesNotFit),
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    #[error("engine thread failed to start: {0}")]
    Thread(String),
    #[error("--context {context} is longer than the model's training context of {train} tokens")]
    ContextTooLong { context: u64, train: u64 },
}

/// What was really allocated, next to what was planned.
#[derive(Debug, Clone, Serialize)]
pub struct MeasuredMemory {
    pub rss_before_load: u64,
    pub rss_after_load: u64,
    pub rss_after_context: u64,
    pub llama: LlamaBuffers,
}

enum Command {
    Submit(Request, crate::request::EventSender),
    /// Members admitted together (see `Scheduler::enqueue_gang`).
    SubmitGroup(Vec<(Request, crate::request::EventSender)>),
    Shutdown,
}

pub struct Engine {
    tx: Sender<Command>,
    model: Arc<Model>,
    plan: MemoryPlan,
    stats: Arc<EngineStats>,
    chat: Result<ChatTemplate, ChatTemplateError>,
    measured: MeasuredMemory,
    max_queue: usize,
    thread: Option<JoinHandle<()>>,
    model_path: PathBuf,
    device: Option<DeviceHandle>,
}

struct LlamaCompute<'m> {
    model: &'m Model,
    ctx: Context<'m>,
}

impl Compute for LlamaCompute<'_> {
    fn batch_capacity(&self) -> usize {
        self.ctx.batch_capacity()
    }
    fn clear_batch(&mut self) {
        self.ctx.clear_batch()
    }
    fn add(&mut self, token: i32, pos: usize, seq: i32, logits: bool) {
        self.ctx.add(token, pos, seq, logits)
    }
    fn decode(&mut self) -> Result<bool, String> {
        self.ctx.decode()
    }
    fn logits(&self, batch_index: usize) -> &[f32] {
        self.ctx.logits(batch_index)
    }
    fn remove_seq(&mut self, seq: i32) {
        self.ctx.remove_seq(seq)
    }
    fn share_prefix(&mut self, src: i32, dst: i32, len: usize) {
        self.ctx.share_prefix(src, dst, len)
    }
    fn truncate_seq(&mut self, seq: i32, len: usize) {
        self.ctx.truncate_seq(seq, len)
    }
    fn save_seq(&mut self, seq: i32) -> Option<(crate::scheduler::Snapshot, usize)> {
        let st = self.ctx.save_seq(seq)?;
        let n = st.byte_len();
        Some((Box::new(st), n))
    }
    fn restore_seq(&mut self, snap: &crate::scheduler::Snapshot, seq: i32) -> bool {
        match snap.downcast_ref::<llama_cpp_2::SeqState>() {
            Some(st) => self.ctx.restore_seq(st, seq),
            None => false,
        }
    }
    fn piece(&self, token: i32) -> Vec<u8> {
        self.model.piece(token)
    }
    fn is_eog(&self, token: i32) -> bool {
        self.model.is_eog(token)
    }
}

impl Engine {
    /// Plans, refuses if the model cannot fit, loads the weights once and starts the engine thread.
    pub fn start(cfg: EngineConfig) -> Result<Engine, EngineError> {
        Self::start_with_observer(cfg, None)
    }

    pub fn start_with_observer(
        cfg: EngineConfig,
        observer: Option<StepObserver>,
    ) -> Result<Engine, EngineError> {
        if cfg.device.is_none() && cfg.gpu_layers.is_some_and(|g| g != GpuLayers::Count(0)) {
            return Err(EngineError::NoDevice);
        }
        let (header, plan) = cfg.plan()?;
        if plan.context > plan.shape.n_ctx_train {
            return Err(EngineError::ContextTooLong {
                context: plan.context,
                train: plan.shape.n_ctx_train,
            });
        }
        plan.check_fits()?;
        for line in plan.summary_lines() {
            tracing::info!("{line}");
        }
        let rss_before_load = current_rss();
        // a fake device (tests) plans and admits like a real one but loads nothing onto it
        let placement = cfg
            .device
            .as_ref()
            .and_then(|d| d.0.ggml_index())
            .map(|index| (index, cfg.offloaded_layers(plan.shape.n_layer)));
        let model = Arc::new(Model::load(&cfg.model, cfg.use_mmap, placement)?);
        let rss_after_load = current_rss();
        let (bos, eos) = model.bos_eos_text();
        let chat = ChatTemplate::new(header.chat_template(), &bos, &eos);
        let stats = Arc::new(EngineStats::default());
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let model = model.clone();
            let plan = plan.clone();
            let stats = stats.clone();
            let threads = cfg.threads;
            let flash_attention = cfg.flash_attention;
            let mut sched_cfg = SchedulerConfig::new(
                plan.kv_cells as usize,
                plan.seq_slots as usize,
                plan.context as usize,
            );
            if !plan.kv_unified {
                sched_cfg.cells_per_slot = Some(plan.kv_cells_per_slot as usize);
            }
            sched_cfg.prefix_store_bytes = plan.prefix_store_bytes as usize;
            sched_cfg.max_itl =
                (cfg.max_itl_ms > 0.0).then(|| Duration::from_secs_f64(cfg.max_itl_ms / 1e3));
            sched_cfg.admission_control = cfg.admission_control;
            if !cfg.prefix_sharing {
                sched_cfg.min_shared_prefix = usize::MAX;
            }
            std::thread::Builder::new()
                .name("abserve-engine".into())
                .spawn(move || {
                    let ctx = match Context::new(
                        &model,
                        &plan,
                        &ContextConfig {
                            threads,
                            flash_attention,
                        },
                    ) {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok((current_rss(), take_buffer_log())));
                    let mut compute = LlamaCompute { model: &model, ctx };
                    let mut sched = Scheduler::new(sched_cfg, stats);
                    if let Some(o) = observer {
                        sched.set_observer(o);
                    }
                    run_loop(&mut sched, &mut compute, rx);
                })
                .map_err(|e| EngineError::Thread(e.to_string()))?
        };
        let (rss_after_context, llama) = ready_rx
            .recv()
            .map_err(|_| EngineError::Thread("engine thread exited during start-up".into()))??;
        let measured = MeasuredMemory {
            rss_before_load,
            rss_after_load,
            rss_after_context,
            llama,
        };
        log_measured(&plan, &measured);
        Ok(Engine {
            max_queue: cfg.max_queue.resolve(plan.seq_slots as usize),
            tx,
            model,
            plan,
            stats,
            chat,
            measured,
            thread: Some(thread),
            model_path: cfg.model,
            device: cfg.device,
        })
    }

    pub fn plan(&self) -> &MemoryPlan {
        &self.plan
    }

    /// Requests that may wait beyond the running slots (the resolved `EngineConfig::max_queue`).
    pub fn max_queue(&self) -> usize {
        self.max_queue
    }

    pub fn measured(&self) -> &MeasuredMemory {
        &self.measured
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The device layers were offloaded to (its memory can be read at any time).
    pub fn device(&self) -> Option<Arc<dyn Device>> {
        self.device.as_ref().map(|d| d.0.clone())
    }

    pub fn model_path(&self) -> &Path {
        &self.model_path
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    pub fn stats_handle(&self) -> Arc<EngineStats> {
        self.stats.clone()
    }

    pub fn is_alive(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// The tokens of a text prompt (special tokens parsed, BOS first once when the vocabulary
    /// asks for it: [`prepare::text_tokens`]).
    pub fn prompt_tokens(&self, text: &str) -> Vec<i32> {
        prepare::text_tokens(self, text)
    }

    /// An input and its sampling settings as a request of this engine's context (the one
    /// preparation stage: [`crate::prepare`]).
    pub fn prepare(
        &self,
        input: Input<'_>,
        sampling: &Sampling,
        options: &Options,
    ) -> Result<Prepared, PrepareError> {
        prepare::prepare(
            self,
            input,
            sampling,
            options,
            Limits::context(self.plan.context as usize),
        )
    }

    /// Queues a request; events arrive on the returned channel. Dropping the receiver cancels
    /// the request and frees its KV cells within one step.
    pub fn submit(&self, req: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        self.check(&req)?;
        self.reserve(1, req.priority)?;
        self.send(req)
    }

    /// Queues requests as one group (a fan-out, `n` choices, a multi-prompt completion): all of
    /// them, or none when the slots and the queue have no room for all (`QueueFull`), or never
    /// could (`GroupTooLarge`). Once accepted, the scheduler admits the members together in one
    /// step, or none of them (they wait whole); none is turned away for a later one.
    pub fn submit_group(
        &self,
        reqs: Vec<Request>,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError> {
        use std::sync::atomic::Ordering;
        for r in &reqs {
            self.check(r)?;
        }
        let n = reqs.len();
        self.reserve(n, false)?;
        let (members, rxs): (Vec<_>, Vec<_>) = reqs
            .into_iter()
            .map(|r| {
                let (tx, rx) = unbounded_channel();
                ((r, tx), rx)
            })
            .unzip();
        if self.tx.send(Command::SubmitGroup(members)).is_err() {
            self.stats.inflight.fetch_sub(n as u64, Ordering::SeqCst);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(rxs)
    }

    /// What the engine itself requires of a request (the server's validation comes first).
    fn check(&self, req: &Request) -> Result<(), SubmitError> {
        if req.prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        let context = self.plan.context as usize;
        if req.prompt.len() >= context {
            return Err(SubmitError::PromptTooLong {
                prompt: req.prompt.len(),
                context,
            });
        }
        req.params
            .validate()
            .map_err(|(n, m)| SubmitError::Invalid(n, m))?;
        if let Some(&bad) = req
            .prompt
            .iter()
            .find(|&&t| t < 0 || t as usize >= self.model.n_vocab())
        {
            return Err(SubmitError::Invalid(
                "prompt",
                format!("token id {bad} is outside the vocabulary"),
            ));
        }
        Ok(())
    }

    /// Takes `n` places among slots + queue at once, or none (the priority lane always has one).
    fn reserve(&self, n: usize, priority: bool) -> Result<(), SubmitError> {
        use std::sync::atomic::Ordering;
        // running sequences fill the slots; beyond slots + max_queue the queue is full
        let slots = self.plan.seq_slots as usize;
        let capacity = slots.saturating_add(self.max_queue);
        if n > capacity {
            return Err(SubmitError::GroupTooLarge {
                group: n,
                capacity,
                slots,
                queue: self.max_queue,
            });
        }
        let inflight = self.stats.inflight.fetch_add(n as u64, Ordering::SeqCst) as usize;
        if !priority && inflight + n > capacity {
            self.stats.inflight.fetch_sub(n as u64, Ordering::SeqCst);
            return Err(SubmitError::QueueFull(self.max_queue));
        }
        Ok(())
    }

    /// Hands a checked request with a reserved place to the engine thread.
    fn send(&self, req: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        use std::sync::atomic::Ordering;
        let (etx, erx) = unbounded_channel();
        if self.tx.send(Command::Submit(req, etx)).is_err() {
            self.stats.inflight.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(erx)
    }

    /// Stops the engine thread after aborting whatever is still queued or running.
    pub fn shutdown(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Tokenizer for Engine {
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, ChatTemplateError> {
        match &self.chat {
            Ok(t) => t.render(messages, true),
            Err(e) => Err(e.clone()),
        }
    }
    fn tokenize(&self, text: &str) -> Vec<i32> {
        self.model.tokenize(text)
    }
    fn bos(&self) -> Option<i32> {
        self.model.bos()
    }
    fn n_vocab(&self) -> usize {
        self.model.n_vocab()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run_loop<C: Compute>(sched: &mut Scheduler, be: &mut C, rx: Receiver<Command>) {
    let handle = |sched: &mut Scheduler, cmd: Command| -> bool {
        match cmd {
            Command::Submit(req, tx) => {
                sched.enqueue(req, tx);
                true
            }
            Command::SubmitGroup(members) => {
                sched.enqueue_gang(members);
                true
            }
            Command::Shutdown => false,
        }
    };
    loop {
        if sched.is_idle() {
            match rx.recv() {
                Ok(cmd) => {
                    if !handle(sched, cmd) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        let mut stop = false;
        while let Ok(cmd) = rx.try_recv() {
            if !handle(sched, cmd) {
                stop = true;
                break;
            }
        }
        if stop {
            break;
        }
        if !sched.step(be) && !sched.is_idle() {
            // nothing runnable yet (e.g. waiting on a shared prefix): wait briefly for input
            match rx.recv_timeout(Duration::from_millis(1)) {
                Ok(cmd) => {
                    if !handle(sched, cmd) {
                        break;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    sched.abort_all(be);
}
