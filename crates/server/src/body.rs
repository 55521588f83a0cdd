//! A JSON request body, parsed once: into a `serde_json` object (checked by the caller's rules:
//! OpenAI's for chat and completions, `inference::body_rules`), then into its wire type. Every
//! failure is a 400 that says what is wrong.

use crate::error::ApiError;

/// Parses a JSON body into `T`, turning every failure into a 400 that says what is wrong.
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    parse_checked(bytes, |_| Ok(()))
}

/// The body parsed once: JSON, an object, `check`ed, then the wire type.
pub fn parse_checked<T: serde::de::DeserializeOwned>(
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
