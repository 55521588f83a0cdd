//! What abserve's programs say to each other and to any OpenAI-compatible server, written once:
//!
//! - [`wire`]: OpenAI request bodies, whole responses, stream chunks, usage and errors (serde);
//! - [`sse`]: one server-sent-events decoder (split reads, comments, `[DONE]`);
//! - [`client`]: one HTTP client for OpenAI-compatible endpoints (base URL normalisation,
//!   model discovery, bearer auth, `Retry-After`, streamed chat with per-chunk timing);
//! - [`prometheus`]: one parser of the Prometheus text format;
//! - [`names`]: the metric names `abserve serve` exports and `loadtest`/`eval` read;
//! - [`location`]: where a store lives (`--store`), and service URLs without their passwords;
//! - [`abserve`]: abserve's own bodies (`/ready`, fan-out);
//! - [`calls`], [`jobs`]: an eval call and its answer, and the job-queue messages that carry them
//!   between `abserve eval --amqp` and `abserve worker`;
//! - [`Structure`]: what an answer must be (`response_format`, tools);
//! - [`Class`]: a request's priority class (`service_tier`);
//! - [`Role`]: what an API key may do (`--keys`);
//! - [`ChatMessage`], [`Sampling`]: the inputs of a generation that requests, variants, eval
//!   calls and the engine's preparation stage share.
//!
//! No dependency on other abserve crates: the server, eval and loadtest all depend on this one.

mod class;
mod client;
mod inputs;
mod prometheus;
mod role;
mod sse;
mod structure;

pub mod abserve;
pub mod calls;
pub mod jobs;
pub mod location;
pub mod names;
pub mod wire;

pub use class::Class;
pub use client::{normalize_base, ChatOutcome, Client, ClientError, StreamTiming};
pub use inputs::{Adapter, ChatMessage, Sampling};
pub use prometheus::{parse as parse_prometheus, Samples};
pub use role::Role;
pub use sse::{SseDecoder, SseEvent};
pub use structure::{
    FunctionCall, FunctionCallDelta, FunctionDef, JsonSchemaFormat, NamedFunction, NamedTool,
    ResponseFormat, Structure, Tool, ToolCall, ToolCallDelta, ToolChoice,
};
