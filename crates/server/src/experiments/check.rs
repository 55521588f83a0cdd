//! An experiment's variant checked as the request it will produce, by the model that will run
//! it, so that an experiment that is stored can serve.

use abserve_engine::prepare::PrepareError;

use crate::error::ApiError;

/// Checks an experiment's variant as the request it will produce, by the model that will run
/// it ([`abserve_models::Model::check`]): its sampling settings, its `max_tokens` within the
/// context, its template by rendering it (bounded) for a probe input, its `response_format`
/// and tools, its adapters. An experiment is stored only when every variant passes; an error
/// names the field under `variants.ID`.
pub fn variant(v: &abserve_ab::Variant, model: &abserve_models::Entry) -> Result<(), ApiError> {
    let scope = format!("variants.{}", v.id);
    let at = |e: PrepareError| ApiError::from(e.within(&scope));
    if v.daily_spend_cap.is_some() && !model.priced() {
        return Err(at(PrepareError::new(
            "daily_spend_cap",
            format!(
                "the model '{}' has no prices (input_price, output_price of its [[upstream]]), so what the variant spends is unknown",
                model.id
            ),
        )));
    }
    let probe = v
        .chat_for_input("test input")
        .map_err(|e| at(PrepareError::new("template", e.message)))?;
    model
        .check(&v.sampling(), &v.structure(), &probe)
        .map_err(at)
}
