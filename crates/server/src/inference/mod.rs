//! The inference API: OpenAI's chat completions, completions and models, and the fan-out of
//! an experiment's variants — the routes that run models.
//!
//! A request's path, as types: the body parsed once and checked by OpenAI's rules
//! (`body_rules`) → for `experiment:NAME`, routed to a variant by the control plane
//! (`crate::experiments::ControlPlane::route`) and the variant applied → each sequence prepared
//! by the registry's model (`abserve_models::Model::prepare`) into a `request::ValidRequest` →
//! admitted as one group (`admission`) → answered whole (`respond`) or streamed (`stream`, tool calls read
//! from the text by `tool_calls`) → the outcome recorded by the control plane.
//!
//! - `api`: the routes `/v1/chat/completions`, `/v1/completions`, `/v1/models`;
//! - `fanout`: `/v1/experiments/{name}/fanout`.

pub(crate) mod admission;
pub(crate) mod api;
pub(crate) mod body_rules;
pub(crate) mod fanout;
mod request;
mod respond;
mod stream;
mod tool_calls;
