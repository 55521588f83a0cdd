//! What an API key may do (`--keys`): its role.

use serde::{Deserialize, Serialize};

/// An API key's role. Each route names the roles that may call it (the server's `auth` module);
/// `Admin` may call every route.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Calls models and experiments' routed models (chat, completions, fan-out) and posts
    /// outcome events.
    Inference,
    /// Reads experiments, results, exposures (and samples) and rates them (events).
    Reviewer,
    /// Everything: creates, changes and deletes experiments, reads the audit log.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Inference, Role::Reviewer, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Inference => "inference",
            Role::Reviewer => "reviewer",
            Role::Admin => "admin",
        }
    }
}
