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
// written as `as_str` names; read by `from_tier`, the one table of names (a test holds the
// derived names to `as_str`)
#[serde(rename_all = "snake_case", try_from = "String")]
pub enum Class {
    /// Also read as `priority` (OpenAI's tier for it).
    #[default]
    Interactive,
    Fanout,
    /// Also read as `flex` (OpenAI's tier for it).
    Batch,
}

impl TryFrom<String> for Class {
    type Error = String;

    /// A class by name (`from_tier`); `auto` and `default` name none, so they are refused where
    /// a class must be given (leave the field out for the default).
    fn try_from(name: String) -> Result<Class, String> {
        Class::from_tier(&name)?.ok_or_else(|| {
            format!("'{name}' names no class here: leave it out for the default, or use priority, flex, interactive, fanout or batch")
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_written_by_their_names_and_read_by_every_tier_name() {
        for c in Class::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
            assert_eq!(
                serde_json::from_value::<Class>(c.as_str().into()).unwrap(),
                c
            );
        }
        let read = |n: &str| serde_json::from_value::<Class>(n.into()).map_err(|e| e.to_string());
        assert_eq!(read("priority"), Ok(Class::Interactive));
        assert_eq!(read("flex"), Ok(Class::Batch));
        assert!(read("auto").unwrap_err().contains("leave it out"));
        assert!(read("urgent")
            .unwrap_err()
            .contains("is not a service tier"));
    }
}
