//! Priority classes: what may wait for what on one model (the scheduler's order, `service_tier`
//! on the wire, an experiment's default).

use serde::{Deserialize, Serialize};

/// A request's priority class: what may wait for what on one model. Live requests are
/// `Interactive` (the default of the OpenAI routes), an experiment's fan-out is `Fanout`, eval
/// jobs and the worker are `Batch`. Ordered most urgent first.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
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
pub enum Class {
    /// Also read as `priority` (OpenAI's tier for it).
    #[default]
    #[serde(alias = "priority")]
    Interactive,
    Fanout,
    /// Also read as `flex` (OpenAI's tier for it).
    #[serde(alias = "flex")]
    Batch,
}

impl Class {
    /// Every class, most urgent first (the order of `/metrics` series).
    pub const ALL: [Class; 3] = [Class::Interactive, Class::Fanout, Class::Batch];

    pub fn as_str(self) -> &'static str {
        match self {
            Class::Interactive => "interactive",
            Class::Fanout => "fanout",
            Class::Batch => "batch",
        }
    }

    /// Its position in [`Class::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The class a name gives: abserve's own names, or OpenAI's `service_tier` values (`auto`
    /// and `default` are `None`: the route's or the experiment's default applies; `priority` is
    /// interactive, `flex` is batch). `Err` lists what is accepted.
    pub fn from_tier(name: &str) -> Result<Option<Class>, String> {
        Ok(Some(match name {
            "auto" | "default" => return Ok(None),
            "priority" | "interactive" => Class::Interactive,
            "fanout" => Class::Fanout,
            "flex" | "batch" => Class::Batch,
            other => {
                return Err(format!(
                    "'{other}' is not a service tier: use auto, default, priority or flex \
                     (OpenAI's), or interactive, fanout or batch"
                ))
            }
        }))
    }
}
