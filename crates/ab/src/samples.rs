//! Sampled conversations (`samples` in an experiment's definition, opt-in): which units are
//! sampled, how many a day, how long they are kept, and the redaction that runs on every string
//! of a sample before anything is written.
//!
//! Invariants:
//! - the decision is deterministic per unit (GrowthBook's hash with the seed
//!   `samples:<experiment seed>`, independent of the variant split), so a sampled unit is sampled
//!   across its whole conversation and an unsampled one never is;
//! - redaction runs before a sample leaves the request's task (the store, the queue and the log
//!   never see the text it replaces): e-mail addresses, IP addresses, card numbers (13–19
//!   digits, spaces or dashes between) and phone numbers (7–15 digits, `+`, spaces, dots,
//!   dashes or brackets between; ISO dates excepted), then the experiment's own patterns.

use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An experiment's sampling of conversations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SampleRules {
    /// The share of units whose conversations are kept, (0, 1].
    pub rate: f64,
    /// The most samples kept per UTC day (per replica); beyond it the day's samples are dropped
    /// (counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daily_cap: Option<u64>,
    /// Days a sample is kept (a fraction allowed); then the sweeper deletes it. Default 30.
    #[serde(default = "thirty")]
    pub retention_days: f64,
    /// Regular expressions (Rust's `regex` syntax) whose matches are replaced by `[redacted]`,
    /// besides the built-in e-mail, phone, card-number and IP patterns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redact: Vec<String>,
    /// The labels a reviewer may give a sample (e.g. `wrong_language`), each recorded as the
    /// event metric `review_label_<label>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

fn thirty() -> f64 {
    30.0
}

/// The longest custom pattern accepted (bytes) and how many.
const MAX_PATTERN: usize = 1000;
const MAX_PATTERNS: usize = 32;

impl SampleRules {
    /// `Err` names the field and the bound.
    pub fn check(&self) -> Result<(), String> {
        if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= 1.0) {
            return Err(format!("samples.rate {} must be in (0, 1]", self.rate));
        }
        if !(self.retention_days.is_finite() && self.retention_days > 0.0) {
            return Err(format!(
                "samples.retention_days {} must be a positive number of days",
                self.retention_days
            ));
        }
        if self.daily_cap == Some(0) {
            return Err(
                "samples.daily_cap must be at least 1 (leave samples out to keep none)".into(),
            );
        }
        if self.redact.len() > MAX_PATTERNS {
            return Err(format!(
                "samples.redact has {} patterns; at most {MAX_PATTERNS}",
                self.redact.len()
            ));
        }
        for l in &self.labels {
            if l.is_empty()
                || l.len() > 64
                || !l.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(format!(
                    "samples.labels: '{l}' must be 1-64 letters, digits or '_' (it names a metric)"
                ));
            }
        }
        for (i, p) in self.redact.iter().enumerate() {
            if p.len() > MAX_PATTERN {
                return Err(format!(
                    "samples.redact[{i}] is longer than {MAX_PATTERN} bytes"
                ));
            }
            Regex::new(p).map_err(|e| format!("samples.redact[{i}]: {e}"))?;
        }
        Ok(())
    }

    /// Whether `unit` of the experiment seeded `seed` is sampled.
    pub fn sampled(&self, seed: &str, unit: &str) -> bool {
        abserve_statistics::hash(&format!("samples:{seed}"), unit, 2).is_some_and(|h| h < self.rate)
    }

    /// The redaction of these rules (the built-in patterns and the experiment's own, compiled).
    pub fn redactor(&self) -> Redactor {
        Redactor {
            own: self
                .redact
                .iter()
                .filter_map(|p| Regex::new(p).ok())
                .collect(),
        }
    }
}

struct Builtin {
    email: Regex,
    ipv4: Regex,
    ipv6: Regex,
    card: Regex,
    phone: Regex,
    iso_date: Regex,
}

fn builtin() -> &'static Builtin {
    static B: OnceLock<Builtin> = OnceLock::new();
    B.get_or_init(|| {
        let r = |p: &str| Regex::new(p).expect("built-in pattern");
        Builtin {
            email: r(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
            ipv4: r(r"\b(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b"),
            ipv6: r(
                r"(?i)\b(?:[0-9a-f]{1,4}:){7}[0-9a-f]{1,4}\b|(?:\b[0-9a-f]{1,4})?(?::[0-9a-f]{1,4}){0,6}::(?:[0-9a-f]{1,4}(?::[0-9a-f]{1,4}){0,6}\b)?",
            ),
            card: r(r"\b\d(?:[ -]?\d){12,18}\b"),
            phone: r(r"\+?\(?\d[\d ().-]{5,}\d"),
            iso_date: r(r"^\d{4}-\d{2}-\d{2}$"),
        }
    })
}

/// Replaces what must not be stored in a sample's strings.
pub struct Redactor {
    own: Vec<Regex>,
}

impl Redactor {
    /// `text` with every built-in match and every match of the experiment's patterns replaced.
    pub fn text(&self, text: &str) -> String {
        let b = builtin();
        let mut t = b.email.replace_all(text, "[email]").into_owned();
        t = b.ipv4.replace_all(&t, "[ip]").into_owned();
        t = b
            .ipv6
            .replace_all(&t, |c: &regex::Captures| {
                // `::` alone, or a time like 12:30, is not an address
                let m = &c[0];
                if m.len() > 2 && m.matches(':').count() >= 2 {
                    "[ip]".to_string()
                } else {
                    m.to_string()
                }
            })
            .into_owned();
        t = b.card.replace_all(&t, "[card]").into_owned();
        t = b
            .phone
            .replace_all(&t, |c: &regex::Captures| {
                let m = &c[0];
                let digits = m.chars().filter(char::is_ascii_digit).count();
                if (7..=15).contains(&digits) && !b.iso_date.is_match(m.trim()) {
                    "[phone]".to_string()
                } else {
                    m.to_string()
                }
            })
            .into_owned();
        for r in &self.own {
            t = r.replace_all(&t, "[redacted]").into_owned();
        }
        t
    }

    /// Every string of `v` (not the keys of its objects) redacted in place.
    pub fn json(&self, v: &mut Value) {
        match v {
            Value::String(s) => *s = self.text(s),
            Value::Array(a) => a.iter_mut().for_each(|x| self.json(x)),
            Value::Object(o) => o.values_mut().for_each(|x| self.json(x)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(redact: &[&str]) -> SampleRules {
        SampleRules {
            rate: 0.5,
            daily_cap: None,
            retention_days: 30.0,
            redact: redact.iter().map(|s| s.to_string()).collect(),
            labels: vec![],
        }
    }

    #[test]
    fn planted_personal_data_is_replaced_and_ordinary_text_kept() {
        let r = rules(&[r"ACCT-\d+"]).redactor();
        let cases = [
            (
                "mail me at jane.doe+ab@example.co.uk now",
                "mail me at [email] now",
            ),
            ("call +1 (415) 555-0132 today", "call [phone] today"),
            ("or 020 7946 0958.", "or [phone]."),
            ("card 4111 1111 1111 1111 exp", "card [card] exp"),
            ("card 5500-0000-0000-0004", "card [card]"),
            (
                "from 192.168.10.254 and 2001:db8:85a3::8a2e:370:7334",
                "from [ip] and [ip]",
            ),
            ("account ACCT-99812 closed", "account [redacted] closed"),
            // kept: dates, times, short numbers, versions
            (
                "on 2026-12-07 at 12:30:45, 3 items, v1.2.3",
                "on 2026-12-07 at 12:30:45, 3 items, v1.2.3",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(r.text(text), want, "{text}");
        }
        let mut v =
            serde_json::json!({"messages": [{"role": "user", "content": "I am bob@x.io"}], "n": 2});
        r.json(&mut v);
        assert_eq!(v["messages"][0]["content"], "I am [email]");
        assert_eq!(v["n"], 2);
    }

    #[test]
    fn a_units_sampling_is_fixed_and_near_the_rate() {
        let r = rules(&[]);
        let n = 4000;
        let sampled = (0..n)
            .filter(|i| r.sampled("exp", &format!("u{i}")))
            .count();
        assert!((1800..2200).contains(&sampled), "{sampled}");
        assert!((0..200)
            .all(|i| r.sampled("exp", &format!("u{i}")) == r.sampled("exp", &format!("u{i}"))));
        // independent of the seed's variant split: another seed samples other units
        let other = (0..n)
            .filter(|i| r.sampled("exp", &format!("u{i}")) != r.sampled("exp2", &format!("u{i}")))
            .count();
        assert!(other > 1000, "{other}");
    }

    #[test]
    fn bad_rules_are_refused_naming_the_field() {
        let mut r = rules(&["("]);
        assert!(r.check().unwrap_err().contains("samples.redact[0]"));
        r.redact.clear();
        r.rate = 0.0;
        assert!(r.check().unwrap_err().contains("samples.rate"));
        r.rate = 1.0;
        r.retention_days = -1.0;
        assert!(r.check().unwrap_err().contains("retention_days"));
        r.retention_days = 0.5;
        r.daily_cap = Some(0);
        assert!(r.check().unwrap_err().contains("daily_cap"));
        r.daily_cap = Some(10);
        assert!(r.check().is_ok());
    }
}

/// What a sampled request was answered: `{text}`, with `tool_calls` (OpenAI's shape) when the
/// answer called tools.
pub fn answer_json(text: &str, tool_calls: Option<Value>) -> Value {
    let mut v = serde_json::json!({ "text": text });
    if let Some(calls) = tool_calls {
        v["tool_calls"] = calls;
    }
    v
}

/// What a sampled request asked, in OpenAI's request shape: `model`, `messages` (or `prompt`),
/// its sampling settings and answer structure as they reached the model (the variant applied).
pub fn asked_json(asked: &crate::Asked, model: &str) -> Value {
    let mut v = serde_json::Map::new();
    v.insert("model".into(), Value::String(model.into()));
    match &asked.prompt {
        crate::Prompt::Chat(m) => v.insert(
            "messages".into(),
            serde_json::to_value(m).unwrap_or_default(),
        ),
        crate::Prompt::Text(t) => v.insert("prompt".into(), Value::String(t.clone())),
    };
    for part in [
        serde_json::to_value(&asked.sampling).unwrap_or_default(),
        serde_json::to_value(&asked.structure).unwrap_or_default(),
    ] {
        if let Value::Object(o) = part {
            v.extend(o);
        }
    }
    Value::Object(v)
}
