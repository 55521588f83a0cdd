//! What the server adds to the engine's one preparation stage (`abserve_engine::prepare`, which
//! holds every check and limit of a request on the model: sampling ranges, the context): a JSON
//! body parsed once into the wire types (OpenAI's body rules: `body_rules`), and an
//! experiment's variant checked as the request it will produce, so an experiment that is
//! created can serve. A [`PrepareError`] becomes a 400
//! naming the parameter (`error.rs`), as OpenAI answers them.
//!
//! Unknown fields are ignored (clients send many), except the fields of OpenAI's API and its
//! peers that would change the answer and that abserve does not implement (a 400 naming each);
//! wrong types are a 400 saying what is wrong.

use abserve_engine::adapters::adapter_set;
use abserve_engine::prepare::{
    constraint, fit_context, sampling_params, shape, Limits, Options, PrepareError, Tokenizer,
};

use crate::body_rules::unsupported_fields;
use crate::error::ApiError;

/// Parses a JSON body into `T`, turning every failure into a 400 that says what is wrong.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    parse_checked(bytes, |_| Ok(()))
}

/// Parses an OpenAI request body (chat or completions) as [`parse_body`] does, refusing every
/// field abserve cannot honour (`body_rules::UNSUPPORTED`) with a 400 naming it.
pub fn parse_openai<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    parse_checked(bytes, |body| Ok(unsupported_fields(body)?))
}

/// The body parsed once: JSON, an object, `check`ed, then the wire type.
fn parse_checked<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    check: impl FnOnce(&serde_json::Map<String, serde_json::Value>) -> Result<(), ApiError>,
) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "We could not parse the JSON body of your request: {e}"
        ))
    })?;
    let Some(body) = value.as_object() else {
        return Err(ApiError::bad_request(
            "The request body must be a JSON object.",
        ));
    };
    check(body)?;
    serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("Invalid request: {e}")))
}

/// Checks an experiment's variant as the request it will produce: its sampling settings by the
/// rules above, its `max_tokens` within `context`, its template by rendering it (bounded) for a
/// probe input, its `response_format` and tools by compiling their grammar for the model's
/// vocabulary (`tok`). An experiment is stored only when every variant passes.
pub fn variant(v: &abserve_ab::Variant, tok: &dyn Tokenizer, context: u64) -> Result<(), ApiError> {
    let scope = format!("variants.{}", v.id);
    let at = |e: PrepareError| ApiError::from(e.within(&scope));
    let s = v.sampling();
    let mut params = sampling_params(&s, &Options::new(16)).map_err(at)?;
    if s.max_tokens.is_some() {
        // the context rule of every request, for the shortest prompt there is
        let limits = Limits::context(context as usize);
        fit_context(&[0], &mut params, true, limits, "prompt").map_err(at)?;
    }
    let probe = v
        .chat_for_input("test input")
        .map_err(|e| at(PrepareError::new("template", e.message)))?;
    let shaped = shape(tok, Some(&probe), &v.structure()).map_err(at)?;
    constraint(tok, shaped.grammar.as_ref()).map_err(at)?;
    // the variant's adapters are admitted into the plan now, so that an experiment that names
    // one that does not fit is refused at creation, not at its first request (once stored, the
    // experiment keeps them loaded: `AppState::pin_adapters`)
    adapter_set(tok.adapters(), s.adapters.as_deref()).map_err(at)?;
    Ok(())
}
