//! abserve's engine: one shared llama.cpp model, a memory plan made before loading, and a
//! continuous-batching scheduler on a dedicated thread. No HTTP here.
//!
//! - [`plan`]: the memory plan from the GGUF header alone ([`gguf`]), before any weights load,
//!   split between host and a [`device`] when layers are offloaded;
//! - `config`: [`EngineConfig`] and the plan it implies; `engine`: [`Engine`], the handle, starts
//!   the thread (`engine_loop`: the step loop, which survives no panic silently) that owns the
//!   llama.cpp context (`llama`: model, context and the scheduler's `Compute` over them) and
//!   takes [`Request`]s; each answers on its own channel of [`Event`]s ([`collect`] folds them);
//! - `scheduler`: admission, KV slots and cells, prefix reuse, batching, preemption (see
//!   docs/engine.md), with [`EngineStats`] as the only shared state;
//! - [`prepare`]: the one preparation stage every caller goes through (messages or a prompt →
//!   template → tokens with one BOS rule → context fit → [`SamplingParams`]);
//! - [`models`]: several base models in one process, one budget divided between them;
//! - `lane_split`: adapter lanes, the slots divided between contexts on the one model that each
//!   apply their own LoRA adapter set and decode side by side;
//! - `sampler`, `text`, `chat`: sampling in Rust, stop strings and UTF-8, chat templates.

pub mod adapters;
mod chat;
mod collect;
mod config;
pub mod device;
mod engine;
mod engine_loop;
#[cfg(any(test, feature = "fault-injection"))]
mod fault;
pub mod grammar;
mod invalid;
mod lane_split;
mod llama;
pub mod models;
pub mod prepare;
mod request;
mod sampler;
mod scheduler;
mod text;
pub mod tools;

pub mod gguf;
pub mod plan;

pub use chat::{ChatMessage, ChatTemplateError};
pub use collect::{collect, collect_blocking, Collector, Output};
pub use config::{DeviceHandle, EngineConfig, EngineError, GpuLayers, QueueLimit};
pub use engine::Engine;
pub use engine::MeasuredMemory;
pub use llama::Model;
pub use request::{
    admitted_together, Class, Completion, Event, EventReceiver, FinishReason, GenerationError,
    GrammarOutcome, Placement, Request, SubmitError,
};
pub use sampler::{SamplingParams, TokenLogprob};
pub use scheduler::{ClassCounts, EngineStats, SetCounts, Speculation, StatsSnapshot};
