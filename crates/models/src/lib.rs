//! The models a process serves, as one registry (one entry per model id, the default first).
//!
//! - [`registry`]: [`Registry`], its [`Entry`]s and the request-level [`Model`] every entry
//!   answers (prepare a sequence, run a group all-or-none, capacity, stats, liveness,
//!   readiness) — the one seam where a model of another kind plugs in;
//! - `local`: [`Local`], an engine of this process as an entry;
//! - `engine_api`: [`EngineApi`], the engine's token-level seam (a test fake implements it);
//! - [`upstream`]: [`Upstream`], a model served elsewhere (vLLM, SGLang, TGI, llama.cpp's
//!   server, another abserve, OpenAI-compatible and Anthropic APIs) as an entry;
//! - [`call`]: an eval call run to the end on the model it names (eval in process, the worker).

pub mod call;
mod engine_api;
mod local;
pub mod registry;
pub mod upstream;

pub use engine_api::EngineApi;
pub use local::Local;
pub use registry::{Capacity, Entry, Model, Prepared, Registry};
pub use upstream::{Upstream, UpstreamConfig};
