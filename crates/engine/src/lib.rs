//! abserve's engine: one shared llama.cpp model, a memory plan made before loading, and a
//! continuous-batching scheduler on a dedicated thread. No HTTP here.

pub mod backend;
pub mod chat;
pub mod collect;
pub mod engine;
pub mod gguf;
pub mod plan;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod text;

pub use engine::{Engine, EngineConfig, EngineError, QueueLimit};
pub use collect::{collect, collect_blocking, Collector, Output};
pub use request::{Completion, Event, EventReceiver, FinishReason, GenerationError, Request, SubmitError};
pub use sampler::SamplingParams;
