//! llama.cpp: loading a GGUF once, creating the one shared context, and the few
//! calls the scheduler makes on it (decode a batch, read logits, drop or share a sequence's KV).
//!
//! Only the engine thread holds a [`Context`]; the [`Model`] (weights and vocabulary) is
//! read-only and shared through an `Arc` so that request validation (tokenizing, chat
//! templates) happens on the caller's thread without touching the context.

use std::ffi::{CStr, CString};
use std::num::NonZeroU32;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaLoraAdapter, LlamaModel};
use llama_cpp_2::token::LlamaToken;

use crate::grammar::{TokenBytes, Vocab};
use crate::plan::{KvType, MemoryPlan};

mod compute;
mod draft;

pub(crate) use self::compute::{Lane, LlamaCompute};
pub(crate) use self::draft::Drafter;

static BACKEND: OnceLock<LlamaBackend> = OnceLock::new();
/// llama.cpp's lines about buffer sizes while an engine starts, kept to compare the plan with
/// what it allocated.
static BUFFER_LOG: Mutex<BufferLog> = Mutex::new(BufferLog::new());

/// Buffer-size lines, kept only between [`begin_buffer_log`] and [`take_buffer_log`]: llama.cpp
/// logs its compute buffers again at every adapter set change, so a log that kept every line
/// would grow for as long as the server runs.
struct BufferLog {
    capturing: bool,
    lines: Vec<String>,
}

impl BufferLog {
    const fn new() -> Self {
        BufferLog {
            capturing: false,
            lines: Vec::new(),
        }
    }
    fn begin(&mut self) {
        self.capturing = true;
        self.lines.clear();
    }
    fn record(&mut self, line: &str) {
        if self.capturing && line.contains("buffer size") {
            self.lines.push(line.to_string());
        }
    }
    fn take(&mut self) -> Vec<String> {
        self.capturing = false;
        std::mem::take(&mut self.lines)
    }
}

/// llama.cpp's log sink.
///
/// # Safety
/// Called by llama.cpp (any thread) with `text` either null or a NUL-terminated string that
/// stays valid for the duration of the call; `_user` is the null pointer given at registration.
unsafe extern "C" fn log_callback(
    level: llama_cpp_sys_2::ggml_log_level,
    text: *const std::os::raw::c_char,
    _user: *mut std::os::raw::c_void,
) {
    if text.is_null() {
        return;
    }
    // SAFETY: not null (checked above) and NUL-terminated for the call, as llama.cpp's logger
    // guarantees; the string is copied before returning.
    let s = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let line = s.trim_end();
    // a poisoned lock is read through (a push cannot leave the list half-written)
    BUFFER_LOG
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .record(line);
    // the unified cache is bigger than the training context by design; each sequence is held to
    // --context (checked against the training context at start-up)
    let level = if line.contains("n_ctx_seq") && line.contains("n_ctx_train") {
        0
    } else {
        level
    };
    // GGML_LOG_LEVEL_ERROR = 4, WARN = 3
    match level {
        4 => tracing::error!(target: "llama.cpp", "{line}"),
        3 => tracing::warn!(target: "llama.cpp", "{line}"),
        _ => tracing::trace!(target: "llama.cpp", "{line}"),
    }
}

/// llama.cpp's process-wide backend, initialised on first use (with abserve's log sink).
pub fn backend() -> Result<&'static LlamaBackend, LlamaError> {
    static INIT: Mutex<()> = Mutex::new(());
    let _once = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = BACKEND.get() {
        return Ok(b);
    }
    // SAFETY: `log_callback` has the signature llama.cpp expects, never unwinds across the
    // FFI boundary (it only copies the text and logs), and keeps no user data (null).
    unsafe { llama_cpp_sys_2::llama_log_set(Some(log_callback), std::ptr::null_mut()) };
    // a build with llama.cpp's backends as loadable modules (one CPU module per instruction set,
    // as llama.cpp's releases ship) picks the best one for this CPU here
    #[cfg(feature = "dynamic-backends")]
    llama_cpp_2::llama_backend::load_backends();
    let b = LlamaBackend::init().map_err(|e| LlamaError::Init(e.to_string()))?;
    Ok(BACKEND.get_or_init(|| b))
}

/// Sizes llama.cpp reported for its buffers, in bytes: (kv, compute, output, model), and how
/// much of them is in device buffers (a buffer whose name is not `CPU…`, e.g. `CUDA0`).
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct LlamaBuffers {
    pub model: u64,
    /// LoRA adapters' tensors (`LoRA buffer`), loaded at start.
    pub adapters: u64,
    pub kv: u64,
    pub compute: u64,
    pub output: u64,
    pub device: u64,
}

fn parse_mib(line: &str) -> u64 {
    // "...buffer size =   123.45 MiB"
    line.rsplit('=')
        .next()
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .map(|mib| (mib * 1024.0 * 1024.0) as u64)
        .unwrap_or(0)
}

/// A buffer line names its buffer type first ("CUDA0 KV buffer size = …", "CPU_Mapped model
/// buffer size = …", after llama.cpp's function name and a colon).
fn on_device(line: &str) -> bool {
    let text = line.rsplit_once(": ").map_or(line, |(_, t)| t).trim_start();
    let buffer = text.split_whitespace().next().unwrap_or("");
    !buffer.is_empty() && !buffer.starts_with("CPU") && !buffer.eq_ignore_ascii_case("host")
}

/// Starts keeping llama.cpp's buffer-size lines (what was kept before is dropped).
pub fn begin_buffer_log() {
    BUFFER_LOG.lock().unwrap_or_else(|p| p.into_inner()).begin();
}

/// The sizes in the lines kept since [`begin_buffer_log`]; stops keeping them.
pub fn take_buffer_log() -> LlamaBuffers {
    let lines = BUFFER_LOG.lock().unwrap_or_else(|p| p.into_inner()).take();
    let mut b = LlamaBuffers::default();
    for l in &lines {
        let v = parse_mib(l);
        if on_device(l) {
            b.device += v;
        }
        if l.contains("LoRA buffer") {
            b.adapters += v;
        } else if l.contains("KV buffer") {
            b.kv += v;
        } else if l.contains("compute buffer") {
            b.compute += v;
        } else if l.contains("output buffer") {
            b.output += v;
        } else if l.contains("model buffer") || l.contains("CPU_Mapped") {
            b.model += v;
        }
    }
    b
}

#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    #[error("llama.cpp's backend did not initialise: {0}")]
    Init(String),
    #[error("llama.cpp could not load model {0} (corrupt or unsupported GGUF)")]
    Load(String),
    #[error("llama.cpp could not create a context of {0} KV cells")]
    Context(u64),
    #[error("{0}")]
    Adapter(String),
}

/// The shared, read-only model: weights, vocabulary, chat template.
pub struct Model {
    inner: LlamaModel,
}

impl Model {
    /// Loads the weights; `device`: (ggml device index, layers) to offload there.
    pub fn load(
        path: &Path,
        use_mmap: bool,
        device: Option<(usize, u64)>,
    ) -> Result<Model, LlamaError> {
        let mut params = LlamaModelParams::default().with_use_mmap(use_mmap);
        if let Some((index, layers)) = device {
            params = params.with_n_gpu_layers(layers.min(u32::MAX as u64) as u32);
            params = params.with_devices(&[index]).map_err(|e| {
                LlamaError::Load(format!("{} (device {index}: {e})", path.display()))
            })?;
        } else {
            // llama.cpp's default offloads every layer when a GPU backend is built in; the plan
            // placed everything on the host
            params = params.with_n_gpu_layers(0);
        }
        let inner = LlamaModel::load_from_file(backend()?, path, &params)
            .map_err(|_| LlamaError::Load(path.display().to_string()))?;
        Ok(Model { inner })
    }

    /// Token ids of `text`, special tokens parsed, nothing added (BOS is the preparation
    /// stage's rule: [`crate::prepare::text_tokens`]).
    pub fn tokenize(&self, text: &str) -> Vec<i32> {
        self.inner
            .vocab()
            .tokenize(text.as_bytes(), false, true)
            .into_iter()
            .map(|t| t.0)
            .collect()
    }

    /// Bytes of one token as the model spells it (special tokens render as empty text).
    pub fn piece(&self, token: i32) -> Vec<u8> {
        self.inner
            .vocab()
            .token_to_piece(LlamaToken(token), false, None)
    }

    /// The BOS token, when the vocabulary asks for one at the start of every prompt.
    pub fn bos(&self) -> Option<i32> {
        let v = self.inner.vocab();
        v.should_add_bos().then(|| v.bos().0)
    }

    /// The vocabulary as llguidance needs it (every token's bytes, special tokens marked, the
    /// end-of-generation set with the end-of-turn token first, and this model's tokenizer), as
    /// llama.cpp's `common/llguidance.cpp` builds it.
    pub fn grammar_vocab(model: &Arc<Model>) -> Vocab {
        let v = model.inner.vocab();
        let tokens = (0..model.n_vocab() as i32)
            .map(|i| {
                let t = LlamaToken(i);
                let bytes = v.token_to_piece(t, false, None);
                if bytes.is_empty() {
                    TokenBytes {
                        bytes: v.token_to_piece(t, true, None),
                        special: true,
                    }
                } else {
                    TokenBytes {
                        bytes,
                        special: false,
                    }
                }
            })
            .collect();
        let primary = if v.eot().0 >= 0 { v.eot() } else { v.eos() };
        let mut eog = vec![primary.0];
        eog.extend(
            (0..model.n_vocab() as i32).filter(|&t| t != primary.0 && v.is_eog(LlamaToken(t))),
        );
        let m = model.clone();
        Vocab {
            tokens,
            eog,
            tokenize: Box::new(move |bytes| {
                m.inner
                    .vocab()
                    .tokenize(bytes, false, true)
                    .into_iter()
                    .map(|t| t.0)
                    .collect()
            }),
        }
    }

    /// The llama.cpp model behind the safe wrapper, for the calls the safe crate lacks.
    fn raw(&self) -> *mut llama_cpp_sys_2::llama_model {
        // SAFETY: `LlamaModel` is #[repr(transparent)] over llama-cpp-2's `Ptr<llama_model>`,
        // itself #[repr(transparent)] over `NonNull<llama_model>`, so reading it as a pointer
        // gives the model llama.cpp allocated, alive as long as `self`.
        unsafe { *(&self.inner as *const LlamaModel).cast::<*mut llama_cpp_sys_2::llama_model>() }
    }

    /// Loads the LoRA adapter at `path` onto the model (llama.cpp keeps it until the model is
    /// freed). The safe crate's loader takes `&mut LlamaModel`, which the shared model cannot
    /// give while its context lives, so this calls the sys binding; only the engine thread
    /// loads adapters, between decodes.
    pub(crate) fn load_lora(&self, path: &Path) -> Result<LlamaLoraAdapter, String> {
        let c = path
            .to_str()
            .and_then(|p| CString::new(p).ok())
            .ok_or_else(|| format!("{}: not a usable path", path.display()))?;
        let model = self.raw();
        // SAFETY: `model` is a live model and `c` a NUL-terminated path that outlives the call;
        // llama.cpp reads the file and the model's tensor table and registers the adapter with
        // the model. Nothing else touches the model's adapters meanwhile: only the engine thread
        // loads or applies them, and other threads only read the vocabulary.
        let raw = unsafe { llama_cpp_sys_2::llama_adapter_lora_init(model, c.as_ptr()) };
        let ptr = NonNull::new(raw)
            .ok_or_else(|| format!("llama.cpp could not load the adapter {}", path.display()))?;
        // SAFETY: `LlamaLoraAdapter` is #[repr(transparent)] over `Ptr<llama_adapter_lora>`,
        // #[repr(transparent)] over `NonNull<llama_adapter_lora>`: the same value the safe
        // crate's own loader wraps; the model owns and frees the adapter, as there.
        Ok(unsafe {
            std::mem::transmute::<NonNull<llama_cpp_sys_2::llama_adapter_lora>, LlamaLoraAdapter>(
                ptr,
            )
        })
    }

    pub fn is_eog(&self, token: i32) -> bool {
        self.inner.vocab().is_eog(LlamaToken(token))
    }

    pub fn n_vocab(&self) -> usize {
        self.inner.n_vocab() as usize
    }

    pub fn token_text(&self, token: i32) -> String {
        String::from_utf8_lossy(&self.piece(token)).into_owned()
    }

    pub fn bos_eos_text(&self) -> (String, String) {
        let v = self.inner.vocab();
        let t = |tok: LlamaToken| {
            v.text(tok)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        (t(v.bos()), t(v.eos()))
    }
}

/// The one llama.cpp context; lives on the engine thread only.
pub struct Context<'m> {
    ctx: LlamaContext<'m>,
    /// The llama.cpp context behind `ctx`, for the calls the safe crate lacks (an adapter set
    /// of several adapters); see [`raw_context`].
    raw: NonNull<llama_cpp_sys_2::llama_context>,
    /// One KV pool (true) or one stream per sequence (false), as the plan laid it out.
    unified: bool,
    batch: LlamaBatch<'static>,
    batch_cap: usize,
    /// Why the batch being built cannot run (a token it could not take).
    overflow: Option<String>,
    /// The threads its decodes use now.
    threads: i32,
}

pub struct ContextConfig {
    pub threads: i32,
    pub flash_attention: bool,
}

impl<'m> Context<'m> {
    pub fn new(
        model: &'m Model,
        plan: &MemoryPlan,
        cfg: &ContextConfig,
    ) -> Result<Self, LlamaError> {
        let kv_type = match plan.kv_type {
            KvType::F16 => KvCacheType::F16,
            KvType::Q8_0 => KvCacheType::Q8_0,
        };
        let n_batch = plan.n_batch as u32;
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(plan.kv_cells as u32))
            .with_n_batch(n_batch)
            .with_n_ubatch(n_batch)
            .with_n_seq_max(plan.seq_slots as u32)
            .with_kv_unified(plan.kv_unified)
            .with_flash_attention_policy(if cfg.flash_attention {
                llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_ENABLED
            } else {
                llama_cpp_sys_2::LLAMA_FLASH_ATTN_TYPE_DISABLED
            })
            .with_type_k(kv_type)
            .with_type_v(kv_type)
            .with_n_threads(cfg.threads)
            .with_n_threads_batch(cfg.threads);
        let ctx = model
            .inner
            .new_context(backend()?, params)
            .map_err(|_| LlamaError::Context(plan.kv_cells))?;
        let raw = raw_context(&ctx, model)?;
        let batch_cap = n_batch as usize;
        Ok(Context {
            ctx,
            raw,
            unified: plan.kv_unified,
            batch: LlamaBatch::new(batch_cap, 1),
            batch_cap,
            overflow: None,
            threads: cfg.threads,
        })
    }

    pub fn batch_capacity(&self) -> usize {
        self.batch_cap
    }

    /// The threads the next decodes use (adapter lanes decoding side by side share them).
    pub(crate) fn set_threads(&mut self, threads: i32) {
        if threads != self.threads {
            // SAFETY: `raw` is this context's live pointer (checked at creation); the call only
            // stores the counts in the context's parameters, between decodes.
            unsafe { llama_cpp_sys_2::llama_set_n_threads(self.raw.as_ptr(), threads, threads) };
            self.threads = threads;
        }
    }

    pub fn clear_batch(&mut self) {
        self.batch.clear();
        self.overflow = None;
    }

    /// Applies `adapters` (each with its scale) to every sequence this context decodes from now
    /// on, replacing what was applied; none is the base model (llama.cpp's
    /// `llama_set_adapters_lora`, which the safe crate offers for one adapter only).
    pub(crate) fn set_adapters(
        &mut self,
        adapters: &[(&LlamaLoraAdapter, f32)],
    ) -> Result<(), String> {
        let mut ptrs: Vec<*mut llama_cpp_sys_2::llama_adapter_lora> = adapters
            .iter()
            // SAFETY: `LlamaLoraAdapter` is #[repr(transparent)] over `Ptr`, itself
            // #[repr(transparent)] over `NonNull<llama_adapter_lora>`: this reads the pointer
            // llama.cpp gave when it loaded the adapter, alive while the map holds it.
            .map(|(a, _)| unsafe {
                *(*a as *const LlamaLoraAdapter).cast::<*mut llama_cpp_sys_2::llama_adapter_lora>()
            })
            .collect();
        let mut scales: Vec<f32> = adapters.iter().map(|(_, s)| *s).collect();
        // SAFETY: `raw` is this context's live pointer (checked at creation, freed only with
        // `ctx`, used on the engine thread only, between decodes); the arrays hold `n` adapters
        // loaded on this context's model and `n` scales, and outlive the call (llama.cpp copies
        // them into its own map).
        let code = unsafe {
            llama_cpp_sys_2::llama_set_adapters_lora(
                self.raw.as_ptr(),
                ptrs.as_mut_ptr(),
                ptrs.len(),
                scales.as_mut_ptr(),
            )
        };
        if code != 0 {
            return Err(format!("llama.cpp refused the adapter set (error {code})"));
        }
        Ok(())
    }

    /// Adds a token to the batch. The scheduler never exceeds the batch capacity; if it did,
    /// the batch is refused at [`Context::decode`] (its requests fail, named) instead of a panic.
    pub fn add(&mut self, token: i32, pos: usize, seq: i32, logits: bool) {
        if let Err(e) = self
            .batch
            .add(LlamaToken(token), pos as i32, &[seq], logits)
        {
            self.overflow.get_or_insert_with(|| {
                format!(
                    "the batch of {} tokens refused one more: {e}",
                    self.batch_cap
                )
            });
        }
    }

    /// Runs the batch. `Ok(false)` means llama.cpp found no KV slot (the caller frees cells
    /// and retries); other failures are errors.
    pub fn decode(&mut self) -> Result<bool, String> {
        if let Some(e) = self.overflow.take() {
            return Err(e);
        }
        match self.ctx.decode(&mut self.batch) {
            Ok(()) => Ok(true),
            Err(llama_cpp_2::DecodeError::NoKvCacheSlot) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn logits(&self, batch_index: usize) -> &[f32] {
        self.ctx.get_logits_ith(batch_index as i32)
    }

    /// Drops every KV cell of `seq` (cells shared with other sequences stay for them).
    pub fn remove_seq(&mut self, seq: i32) {
        let _ = self.ctx.clear_kv_cache_seq(Some(seq as u32), None, None);
    }

    /// Gives `dst` the KV of positions [0, len) of `src`. Unified cache: the cells get a second
    /// sequence id (no copy). Split streams: llama.cpp copies only WHOLE streams between
    /// sequences (a partial range aborts the process), so the whole of `src`'s stream is copied
    /// (the data lands at the next decode, before that batch writes anything) and `dst` is then
    /// cut back to `len` positions.
    pub fn share_prefix(&mut self, src: i32, dst: i32, len: usize) {
        if self.unified {
            let _ = self
                .ctx
                .copy_kv_cache_seq(src, dst, Some(0), Some(len as u32));
        } else {
            let _ = self.ctx.copy_kv_cache_seq(src, dst, None, None);
            self.truncate_seq(dst, len);
        }
    }

    /// Drops positions [len, ∞) of `seq` (a slot's cached tokens past the common prefix).
    pub fn truncate_seq(&mut self, seq: i32, len: usize) {
        let _ = self
            .ctx
            .clear_kv_cache_seq(Some(seq as u32), Some(len as u32), None);
    }

    /// The KV of `seq` copied to host memory (llama.cpp's sequence state: its cells only).
    pub fn save_seq(&self, seq: i32) -> Option<llama_cpp_2::SeqState> {
        self.ctx
            .state_seq_get(seq, llama_cpp_2::LlamaStateSeqFlags::empty())
            .ok()
    }

    /// Loads a saved state into `seq` (which may differ from the one it was saved from).
    pub fn restore_seq(&mut self, state: &llama_cpp_2::SeqState, seq: i32) -> bool {
        self.ctx.state_seq_set(state, seq).is_ok()
    }
}

/// The llama.cpp context inside llama-cpp-2's wrapper. The crate (pinned, `=0.1.160`) keeps
/// the pointer private; its `Debug` prints it (`LlamaContext { context: 0x… }`, `NonNull`'s
/// address). The address read back is checked before use: llama.cpp must report it as a
/// context of `model` with the wrapper's cell count, else the context is refused.
fn raw_context(
    ctx: &LlamaContext<'_>,
    model: &Model,
) -> Result<NonNull<llama_cpp_sys_2::llama_context>, LlamaError> {
    let shown = format!("{ctx:?}");
    let refused = || {
        LlamaError::Init(format!(
            "llama-cpp-2 no longer shows its context pointer ({shown})"
        ))
    };
    let hex: String = shown
        .split_once("context: 0x")
        .ok_or_else(refused)?
        .1
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    let addr = usize::from_str_radix(&hex, 16).map_err(|_| refused())?;
    let raw = NonNull::new(std::ptr::with_exposed_provenance_mut(addr)).ok_or_else(refused)?;
    let model_ptr = model.raw().cast_const();
    // SAFETY: `raw` is the address the wrapper printed for its own live context (the wrapper
    // prints nothing else in hex); llama.cpp's getters only read the context.
    let (owner, cells) = unsafe {
        (
            llama_cpp_sys_2::llama_get_model(raw.as_ptr()),
            llama_cpp_sys_2::llama_n_ctx(raw.as_ptr()),
        )
    };
    if owner != model_ptr || cells != ctx.n_ctx() {
        return Err(refused());
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::BufferLog;

    #[test]
    fn the_buffer_log_keeps_lines_only_while_an_engine_starts() {
        let mut log = BufferLog::new();
        log.record("llama_context:        CPU compute buffer size =    13.50 MiB");
        log.begin();
        log.record("load_tensors:   CPU_Mapped model buffer size =    92.12 MiB");
        log.record("llama_context: n_ctx = 512");
        assert_eq!(log.take().len(), 1, "only buffer lines, only after begin");
        // an adapter set change after start logs the compute buffers again: not kept
        for _ in 0..1000 {
            log.record("sched_reserve:        CPU compute buffer size =    13.50 MiB");
        }
        assert!(log.take().is_empty());
        assert_eq!(log.lines.capacity(), 0);
    }
}
