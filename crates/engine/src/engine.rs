//! The engine handle: plan memory, load the model once, and run the scheduler on one dedicated
//! thread (`engine_loop`) that alone owns the llama.cpp context. Everything else holds an
//! [`Engine`] and talks to that thread through a channel (validation → queue → scheduler →
//! llama.cpp, as TGI's router does).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use abserve_protocol::Tool;
use crossbeam_channel::{Receiver, Sender};
use serde::Serialize;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::adapters::AdapterBudget;
use crate::chat::{ChatMessage, ChatTemplate, ChatTemplateError};
use crate::config::{DeviceHandle, EngineConfig, EngineError, GpuLayers};
use crate::device::Device;
use crate::engine_loop::{run_guarded, Command};
use crate::grammar::Grammars;
use crate::lane_split::Lanes;
use crate::llama::{
    begin_buffer_log, take_buffer_log, Context, ContextConfig, Drafter, Lane, LlamaBuffers,
    LlamaCompute, LlamaError, Model,
};
use crate::plan::{current_rss, human_bytes, return_large_frees, MemoryPlan};
use crate::prepare::{self, Tokenizer};
use crate::request::{Class, Event, Request, SubmitError};
use crate::scheduler::{
    EngineStats, InFlight, Scheduler, SchedulerConfig, StatsSnapshot, StepObserver,
};
use crate::tools::ToolFormat;

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

/// What was really allocated, next to what was planned.
#[derive(Debug, Clone, Serialize)]
pub struct MeasuredMemory {
    pub rss_before_load: u64,
    pub rss_after_load: u64,
    pub rss_after_context: u64,
    pub llama: LlamaBuffers,
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
    /// Why the engine thread stopped, when it was not asked to (see `engine_loop`).
    failure: Arc<Mutex<Option<String>>>,
    /// The grammar compiler, built from the vocabulary at the first constrained request.
    grammars: std::sync::OnceLock<Result<Grammars, String>>,
    /// The plan's adapter reservation (`None`: no adapter may be named).
    adapters: Option<AdapterBudget>,
}

/// What the engine thread starts with: it creates the one llama.cpp context, says when it is
/// ready (or why it is not), then runs the step loop until shutdown or a caught panic.
struct EngineThread {
    model: Arc<Model>,
    plan: MemoryPlan,
    context: ContextConfig,
    scheduler: SchedulerConfig,
    stats: Arc<EngineStats>,
    observer: Option<StepObserver>,
    failure: Arc<Mutex<Option<String>>>,
    /// The plan's adapter reservation: the adapters to load before the first request (`--lora`,
    /// as it resolved them), and what may be loaded and must be freed later.
    adapters: Option<AdapterBudget>,
    /// The draft model (`--draft-model`), its context made on the thread.
    draft: Option<Model>,
}

/// Loads `--draft-model` (on the host) and checks that its tokens are the model's, id by id: a
/// draft of other tokens would propose what the model never says.
fn load_draft(cfg: &EngineConfig, model: &Model) -> Result<Option<Model>, EngineError> {
    let Some(path) = &cfg.draft_model else {
        return Ok(None);
    };
    let draft = Model::load(path, cfg.use_mmap, None)?;
    let differs = (0..model.n_vocab() as i32).find(|&t| draft.piece(t) != model.piece(t));
    if draft.n_vocab() != model.n_vocab() || differs.is_some() {
        return Err(EngineError::DraftModel(format!(
            "{}: its vocabulary is not the model's ({} and {} tokens{})",
            path.display(),
            draft.n_vocab(),
            model.n_vocab(),
            differs.map_or(String::new(), |t| format!(", token {t} differs")),
        )));
    }
    Ok(Some(draft))
}

/// The thread's llama.cpp state: a context per lane, the adapters loaded at start, the draft
/// model's context.
type Contexts<'m> = (
    Vec<Lane<'m>>,
    HashMap<PathBuf, llama_cpp_2::model::LlamaLoraAdapter>,
    Option<Drafter<'m>>,
);

/// Creates the contexts (one per lane of `split`), loads the adapters the plan admitted at
/// start and creates the draft model's context.
fn contexts<'m>(
    model: &'m Model,
    draft: Option<&'m Model>,
    plan: &MemoryPlan,
    cfg: &ContextConfig,
    adapters: Option<&AdapterBudget>,
    split: Lanes,
) -> Result<Contexts<'m>, LlamaError> {
    let mut lanes = Vec::with_capacity(split.count());
    for l in 0..split.count() {
        let lane = lane_plan(plan, split, l);
        lanes.push(Lane::new(Context::new(model, &lane, cfg)?));
    }
    let mut loras = HashMap::new();
    let preload = adapters.map(|a| a.admitted()).unwrap_or_default();
    for (p, _) in &preload {
        let a = model.load_lora(p).map_err(LlamaError::Adapter)?;
        loras.insert(p.clone(), a);
        if let Some(b) = adapters {
            b.mark_loaded(p);
        }
    }
    let drafter = match draft {
        Some(m) => Some(Drafter::new(m, plan, cfg)?),
        None => None,
    };
    Ok((lanes, loras, drafter))
}

impl EngineThread {
    /// Starts the thread and waits until its context exists: the handle, the resident memory
    /// then and llama.cpp's buffers.
    fn spawn(
        self,
        rx: Receiver<Command>,
    ) -> Result<(JoinHandle<()>, u64, LlamaBuffers), EngineError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("abserve-engine".into())
            .spawn(move || {
                let split = Lanes::new(self.plan.seq_slots as usize, self.plan.lanes as usize);
                let made = contexts(
                    &self.model,
                    self.draft.as_ref(),
                    &self.plan,
                    &self.context,
                    self.adapters.as_ref(),
                    split,
                );
                let (lanes, loras, drafter) = match made {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok((current_rss(), take_buffer_log())));
                let mut compute = LlamaCompute {
                    model: &self.model,
                    lanes,
                    split,
                    loras,
                    budget: self.adapters,
                    index: Vec::new(),
                    pending: Vec::new(),
                    threads: self.context.threads,
                    broken: Vec::new(),
                    refused: None,
                    drafter,
                };
                let mut sched = Scheduler::new(self.scheduler, self.stats);
                if let Some(o) = self.observer {
                    sched.set_observer(o);
                }
                let failure = self.failure;
                let died = move |cause: &str| {
                    *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(cause.to_string());
                };
                // the cause is kept by `died` (read by `Engine::failure`)
                #[cfg(feature = "fault-injection")]
                if let Some(at) = crate::fault::injected_panic() {
                    let mut faulty = crate::fault::PanicAt::new(compute, at);
                    let _ = run_guarded(&mut sched, &mut faulty, &rx, died);
                    return;
                }
                let _ = run_guarded(&mut sched, &mut compute, &rx, died);
            })
            .map_err(|e| EngineError::Thread(e.to_string()))?;
        let (rss, llama) = ready_rx
            .recv()
            .map_err(|_| EngineError::Thread("engine thread exited during start-up".into()))??;
        Ok((thread, rss, llama))
    }
}

/// Lane `l`'s part of the plan: its slots, with one stream of the plan's cells each (one lane:
/// the plan).
fn lane_plan(plan: &MemoryPlan, split: Lanes, l: usize) -> MemoryPlan {
    let mut p = plan.clone();
    if split.count() > 1 {
        p.seq_slots = split.len(l) as u64;
        p.kv_cells = p.seq_slots * plan.kv_cells_per_slot;
    }
    p
}

/// The plan's adapter reservation with the adapters loaded at start admitted into it (`None`
/// when the server takes no adapters).
fn adapter_budget(
    cfg: &EngineConfig,
    plan: &MemoryPlan,
    header: &crate::gguf::GgufHeader,
) -> Result<Option<AdapterBudget>, EngineError> {
    if cfg.adapters.is_empty() && cfg.adapter_dir.is_none() {
        return Ok(None);
    }
    AdapterBudget::new(
        plan.adapter_bytes,
        header,
        &cfg.adapters,
        cfg.adapter_dir.as_deref(),
    )
    .map(Some)
    .map_err(|e| EngineError::Adapter(e.to_string()))
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
        if cfg.adapter_lanes > 1 && (cfg.kv_unified || !cfg.admission_control) {
            return Err(EngineError::LanesNeedSplitStreams(cfg.adapter_lanes));
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
        // adapters are checked against the model and the plan before anything is loaded
        let adapters = adapter_budget(&cfg, &plan, &header)?;
        return_large_frees();
        let rss_before_load = current_rss();
        // what llama.cpp logged before (another engine's adapters loaded on demand) is not ours
        begin_buffer_log();
        // a fake device (tests) plans and admits like a real one but loads nothing onto it
        let placement = cfg
            .device
            .as_ref()
            .and_then(|d| d.0.ggml_index())
            .map(|index| (index, cfg.offloaded_layers(plan.shape.n_layer)));
        let model = Arc::new(Model::load(&cfg.model, cfg.use_mmap, placement)?);
        let draft = load_draft(&cfg, &model)?;
        let rss_after_load = current_rss();
        let (bos, eos) = model.bos_eos_text();
        let chat = ChatTemplate::new(header.chat_template(), &bos, &eos);
        let stats = Arc::new(EngineStats::default());
        let failure = Arc::new(Mutex::new(None));
        let (tx, rx) = crossbeam_channel::unbounded();
        let (thread, rss_after_context, llama) = EngineThread {
            model: model.clone(),
            plan: plan.clone(),
            context: ContextConfig {
                threads: cfg.threads,
                flash_attention: cfg.flash_attention,
            },
            scheduler: cfg.scheduler_config(&plan),
            stats: stats.clone(),
            observer,
            failure: failure.clone(),
            adapters: adapters.clone(),
            draft,
        }
        .spawn(rx)?;
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
            failure,
            grammars: std::sync::OnceLock::new(),
            adapters,
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

    /// The engine thread runs and has not died (a caught panic marks it dead at once, before
    /// the thread has finished failing its requests).
    pub fn is_alive(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished()) && self.failure().is_none()
    }

    /// Why the engine thread died (a caught panic), once it has.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The tokens of a text prompt (special tokens parsed, BOS first once when the vocabulary
    /// asks for it: [`prepare::text_tokens`]).
    pub fn prompt_tokens(&self, text: &str) -> Vec<i32> {
        prepare::text_tokens(self, text)
    }

    /// Queues a request; events arrive on the returned channel. Dropping the receiver cancels
    /// the request and frees its KV cells within one step.
    pub fn submit(&self, req: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        self.check(&req)?;
        let permit = self.reserve(1, req.probe, req.class)?.remove(0);
        self.send(req, permit)
    }

    /// Queues requests as one group (a fan-out, `n` choices, a multi-prompt completion): all of
    /// them, or none when the slots and the queue have no room for all (`QueueFull`), or never
    /// could (`GroupTooLarge`). Once accepted, the scheduler admits the members together in one
    /// step, or none of them (they wait whole); none is turned away for a later one.
    pub fn submit_group(
        &self,
        reqs: Vec<Request>,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError> {
        for r in &reqs {
            self.check(r)?;
        }
        let class = reqs.iter().map(|r| r.class).min().unwrap_or_default();
        let permits = self.reserve(reqs.len(), false, class)?;
        let (members, rxs): (Vec<_>, Vec<_>) = reqs
            .into_iter()
            .zip(permits)
            .map(|(r, permit)| {
                let (tx, rx) = unbounded_channel();
                ((r, tx, permit), rx)
            })
            .unzip();
        // refused, the command is dropped and its permits with it
        if self.tx.send(Command::SubmitGroup(members)).is_err() {
            return Err(SubmitError::ShuttingDown);
        }
        Ok(rxs)
    }

    /// What the engine itself requires of a request (the server's validation comes first).
    fn check(&self, req: &Request) -> Result<(), SubmitError> {
        crate::request::prompt_fits(req.prompt.len(), self.plan.context as usize)?;
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

    /// Takes `n` places of `class` among slots + queue at once, or none: refused when the
    /// requests of `class` and more urgent classes fill them (less urgent work gives its slots
    /// up: `scheduler/classes.rs`); a readiness probe always has one.
    fn reserve(&self, n: usize, probe: bool, class: Class) -> Result<Vec<InFlight>, SubmitError> {
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
        let (inflight, permits) = InFlight::take(&self.stats, n, class);
        if !probe && inflight + n > capacity {
            return Err(SubmitError::QueueFull(self.max_queue));
        }
        Ok(permits)
    }

    /// Hands a checked request with a reserved place to the engine thread.
    fn send(
        &self,
        req: Request,
        permit: InFlight,
    ) -> Result<UnboundedReceiver<Event>, SubmitError> {
        let (etx, erx) = unbounded_channel();
        if self.tx.send(Command::Submit(req, etx, permit)).is_err() {
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
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[Tool],
    ) -> Result<String, ChatTemplateError> {
        match &self.chat {
            Ok(t) => t.render(messages, tools, true),
            Err(e) => Err(e.clone()),
        }
    }
    fn tool_format(&self) -> ToolFormat {
        self.chat
            .as_ref()
            .map_or(ToolFormat::Generic, |t| t.tool_format())
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
    fn adapters(&self) -> Option<&AdapterBudget> {
        self.adapters.as_ref()
    }
    fn grammars(&self) -> Result<&Grammars, String> {
        self.grammars
            .get_or_init(|| {
                Grammars::new(
                    Model::grammar_vocab(&self.model),
                    self.stats.grammar_stats(),
                )
            })
            .as_ref()
            .map_err(|e| e.clone())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown();
    }
}
