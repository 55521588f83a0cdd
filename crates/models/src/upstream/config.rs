//! What the operator says about a model served elsewhere: `--upstream ID=URL` for the simple
//! case, `[[upstream]]` tables of a TOML file (`--upstreams FILE`) for the rest.
//!
//! Invariants: a config names at least one URL, each `http://` or `https://` with no query;
//! a key is never held in a field that is printed (`Debug` shows where it comes from, not the
//! key); every duration and price is finite and positive (or zero for prices).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The protocol an upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// OpenAI's chat completions (`/v1/chat/completions`): vLLM, SGLang, TGI, llama.cpp's
    /// server, Ollama, abserve, OpenAI and the compatible endpoints of hosted providers.
    #[default]
    Openai,
    /// Anthropic's Messages API (`/v1/messages`), translated both ways.
    Anthropic,
}

/// One `[[upstream]]` table.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// The id requests and variants name it by.
    pub id: String,
    /// One URL, or several replicas of the same model (`urls`).
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub urls: Vec<String>,
    /// The model's name at the upstream [default: the first the upstream's `/v1/models` lists].
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub protocol: Protocol,
    /// The environment variable that holds the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// A file that holds the API key (its first line).
    #[serde(default)]
    pub api_key_file: Option<PathBuf>,
    /// Seconds to open a connection.
    #[serde(default = "connect_s")]
    pub connect_timeout: f64,
    /// Seconds from sending a request to the first token (or the first byte of a whole answer).
    #[serde(default = "first_token_s")]
    pub first_token_timeout: f64,
    /// Seconds a whole request may take.
    #[serde(default = "total_s")]
    pub total_timeout: f64,
    /// Retries of a request the upstream refused for load (429, 503) or could not be reached
    /// for, before anything reached the client.
    #[serde(default = "retries")]
    pub retries: u32,
    /// Requests at once, when the upstream does not say (llama.cpp's `/props` and SGLang's
    /// `/get_server_info` do).
    #[serde(default)]
    pub max_concurrency: Option<usize>,
    /// Tokens (prompt + `max_tokens`) in flight at once, when the upstream does not say.
    #[serde(default)]
    pub token_capacity: Option<usize>,
    /// Tokens of one request (prompt + answer), when the upstream does not say.
    #[serde(default)]
    pub context: Option<usize>,
    /// Price per million prompt tokens.
    #[serde(default)]
    pub input_price: f64,
    /// Price per million completion tokens.
    #[serde(default)]
    pub output_price: f64,
    /// Headers sent with every request (e.g. an organisation id).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Hold new work back while the upstream's own saturation (its scraped KV-cache use) is at
    /// or above this share.
    #[serde(default = "saturation")]
    pub saturation_threshold: f64,
    /// Failures in a row after which a URL's breaker opens.
    #[serde(default = "breaker_failures")]
    pub breaker_failures: u32,
    /// Seconds an open breaker waits before one probe (half-open).
    #[serde(default = "breaker_cooldown_s")]
    pub breaker_cooldown: f64,
    /// Seconds a successful readiness probe (a real 1-token inference) is reused by `/ready`,
    /// so that readiness checks do not spend on a paid API every time they are asked; a failed
    /// probe is never reused.
    #[serde(default = "probe_interval_s")]
    pub probe_interval: f64,
}

fn connect_s() -> f64 {
    5.0
}
fn first_token_s() -> f64 {
    60.0
}
fn total_s() -> f64 {
    600.0
}
fn retries() -> u32 {
    2
}
fn saturation() -> f64 {
    0.85
}
fn breaker_failures() -> u32 {
    5
}
fn breaker_cooldown_s() -> f64 {
    10.0
}
fn probe_interval_s() -> f64 {
    30.0
}

/// The key is never printed: only where it comes from.
impl std::fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConfig")
            .field("id", &self.id)
            .field("urls", &self.urls())
            .field("model", &self.model)
            .field("protocol", &self.protocol)
            .field("api_key_env", &self.api_key_env)
            .field("api_key_file", &self.api_key_file)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    upstream: Vec<UpstreamConfig>,
}

impl UpstreamConfig {
    /// `ID=URL` (`--upstream`), every other setting its default.
    pub fn from_flag(flag: &str) -> Result<UpstreamConfig, String> {
        let Some((id, url)) = flag.split_once('=') else {
            return Err(format!(
                "--upstream takes ID=URL (e.g. vllm=http://10.0.0.5:8000/v1), got '{flag}'"
            ));
        };
        let c: UpstreamConfig = toml::from_str(&format!(
            "id = {}\nurl = {}",
            toml_string(id),
            toml_string(url)
        ))
        .map_err(|e| e.to_string())?;
        c.check()?;
        Ok(c)
    }

    /// The `[[upstream]]` tables of a TOML file.
    pub fn from_file(path: &Path) -> Result<Vec<UpstreamConfig>, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let f: File = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        for c in &f.upstream {
            c.check()
                .map_err(|e| format!("{}: upstream '{}': {e}", path.display(), c.id))?;
        }
        Ok(f.upstream)
    }

    /// Whether answers have a price (either price above 0).
    pub fn priced(&self) -> bool {
        self.input_price > 0.0 || self.output_price > 0.0
    }

    /// Every URL, as given (`url` first).
    pub fn urls(&self) -> Vec<String> {
        self.url.iter().chain(&self.urls).cloned().collect()
    }

    fn check(&self) -> Result<(), String> {
        if self.id.is_empty() || self.id.contains(char::is_whitespace) {
            return Err(format!("'{}' is not a model id", self.id));
        }
        let urls = self.urls();
        if urls.is_empty() {
            return Err("give `url` or `urls`".into());
        }
        for u in &urls {
            let p = reqwest::Url::parse(u).map_err(|e| format!("'{u}' is not a URL: {e}"))?;
            if !matches!(p.scheme(), "http" | "https") || p.query().is_some() {
                return Err(format!(
                    "'{u}' must be an http:// or https:// base URL without a query"
                ));
            }
            if !p.username().is_empty() || p.password().is_some() {
                return Err(
                    "a URL may not carry credentials: give the key with api_key_env or api_key_file"
                        .into(),
                );
            }
        }
        for (name, v) in [
            ("connect_timeout", self.connect_timeout),
            ("first_token_timeout", self.first_token_timeout),
            ("total_timeout", self.total_timeout),
            ("breaker_cooldown", self.breaker_cooldown),
            ("probe_interval", self.probe_interval),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!(
                    "{name} must be a positive number of seconds, got {v}"
                ));
            }
        }
        for (name, v) in [
            ("input_price", self.input_price),
            ("output_price", self.output_price),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be a price of 0 or more, got {v}"));
            }
        }
        if !(self.saturation_threshold > 0.0 && self.saturation_threshold <= 1.0) {
            return Err(format!(
                "saturation_threshold must be in (0, 1], got {}",
                self.saturation_threshold
            ));
        }
        for (name, v) in [
            ("max_concurrency", self.max_concurrency),
            ("token_capacity", self.token_capacity),
            ("context", self.context),
        ] {
            if v == Some(0) {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if self.breaker_failures == 0 {
            return Err("breaker_failures must be at least 1".into());
        }
        if self.api_key_env.is_some() && self.api_key_file.is_some() {
            return Err("give api_key_env or api_key_file, not both".into());
        }
        Ok(())
    }

    /// The API key, read from where the config says (none when it says nowhere).
    pub fn api_key(&self) -> Result<Option<String>, String> {
        if let Some(var) = &self.api_key_env {
            return match std::env::var(var) {
                Ok(k) if !k.trim().is_empty() => Ok(Some(k.trim().to_string())),
                _ => Err(format!(
                    "upstream '{}': the environment variable {var} holds no key",
                    self.id
                )),
            };
        }
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                format!(
                    "upstream '{}': cannot read the key file {}: {e}",
                    self.id,
                    path.display()
                )
            })?;
            let key = text.lines().next().unwrap_or("").trim().to_string();
            if key.is_empty() {
                return Err(format!(
                    "upstream '{}': the key file {} is empty",
                    self.id,
                    path.display()
                ));
            }
            return Ok(Some(key));
        }
        Ok(None)
    }

    pub fn timeouts(&self) -> (Duration, Duration, Duration) {
        (
            Duration::from_secs_f64(self.connect_timeout),
            Duration::from_secs_f64(self.first_token_timeout),
            Duration::from_secs_f64(self.total_timeout),
        )
    }
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_names_one_url_with_the_defaults() {
        let c = UpstreamConfig::from_flag("vllm=http://10.0.0.5:8000/v1").unwrap();
        assert_eq!(c.id, "vllm");
        assert_eq!(c.urls(), ["http://10.0.0.5:8000/v1"]);
        assert_eq!((c.retries, c.saturation_threshold), (2, 0.85));
        for bad in [
            "novalue",
            "x=ftp://h/v1",
            "x=http://u:secret@h/v1",
            "x=not a url",
        ] {
            let e = UpstreamConfig::from_flag(bad).unwrap_err();
            assert!(!e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn a_file_takes_every_setting_and_refuses_unknown_ones() {
        let dir = std::env::temp_dir().join(format!("abserve-upstream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("u.toml");
        std::fs::write(
            &path,
            r#"
[[upstream]]
id = "gpt"
urls = ["https://a.example/v1", "https://b.example/v1"]
model = "gpt-4o-mini"
api_key_env = "ABSERVE_TEST_KEY_VAR"
total_timeout = 30
input_price = 0.15
output_price = 0.6
headers = { "OpenAI-Organization" = "org-1" }
[[upstream]]
id = "claude"
url = "https://api.anthropic.example"
protocol = "anthropic"
max_concurrency = 8
"#,
        )
        .unwrap();
        let cs = UpstreamConfig::from_file(&path).unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[0].urls().len(), 2);
        assert_eq!(cs[0].timeouts().2, Duration::from_secs(30));
        assert_eq!(cs[1].protocol, Protocol::Anthropic);
        std::env::set_var("ABSERVE_TEST_KEY_VAR", "sk-very-secret");
        assert_eq!(cs[0].api_key().unwrap().as_deref(), Some("sk-very-secret"));
        assert!(!format!("{:?}", cs[0]).contains("sk-very-secret"));
        std::fs::write(
            &path,
            "[[upstream]]\nid = \"x\"\nurl = \"http://h\"\nspeed = 1\n",
        )
        .unwrap();
        let e = UpstreamConfig::from_file(&path).unwrap_err();
        assert!(e.contains("speed"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
