//! Where generations come from: the abserve engine in this process, or any OpenAI-compatible
//! endpoint over HTTP (abserve, vLLM, llama.cpp server, OpenAI). Both give the same
//! [`Generation`] with time to first token measured by streaming.

use std::sync::Arc;
use std::time::{Duration, Instant};

use abserve_engine::chat::ChatMessage;
use abserve_engine::{Engine, Event, Request, SamplingParams, SubmitError};
use futures::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};

/// One chat request of a variant for a row.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    pub messages: Vec<ChatMessage>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub max_tokens: u32,
    pub seed: Option<u64>,
    pub stop: Option<Vec<String>>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Generation {
    pub text: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub ttft: Duration,
    pub latency: Duration,
    pub finish_reason: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CallError {
    /// 429 or a full engine queue: try again after the hint.
    Overloaded { retry_after: Option<Duration> },
    /// Connection errors and 5xx: worth a few retries.
    Transient(String),
    /// Everything else (4xx, bad responses): recorded, not retried.
    Failed(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Overloaded { .. } => write!(f, "overloaded (429)"),
            CallError::Transient(m) | CallError::Failed(m) => write!(f, "{m}"),
        }
    }
}

pub struct Http {
    client: reqwest::Client,
    /// Endpoint root without a trailing `/v1`.
    base: String,
    key: Option<String>,
    pub model: String,
}

pub enum Target {
    Engine(Arc<Engine>),
    Http(Http),
}

/// How many requests to keep in flight, and where that number came from.
#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    pub concurrency: usize,
    pub source: String,
    /// The target is abserve (memory and KV can be shown).
    pub abserve: bool,
}

fn normalize(url: &str) -> String {
    let u = url.trim_end_matches('/');
    u.strip_suffix("/v1").unwrap_or(u).to_string()
}

impl Http {
    /// Connects to an endpoint; without `model`, the first id of `GET /v1/models` is used.
    pub async fn connect(url: &str, key: Option<String>, model: Option<String>) -> Result<Http, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(600))
            .build()
            .map_err(|e| e.to_string())?;
        let base = normalize(url);
        let mut h = Http { client, base, key, model: model.clone().unwrap_or_default() };
        if model.is_none() {
            let r = h.get("/v1/models").send().await.map_err(|e| format!("cannot reach {}: {e}", h.base))?;
            let status = r.status();
            let body: Value = r.json().await.map_err(|e| format!("{}/v1/models: {e}", h.base))?;
            if !status.is_success() {
                return Err(format!("{}/v1/models answered {status}: {body}", h.base));
            }
            h.model = body["data"][0]["id"]
                .as_str()
                .ok_or_else(|| format!("{}/v1/models lists no model; pass --remote-model", h.base))?
                .to_string();
        }
        Ok(h)
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        let r = self.client.get(format!("{}{path}", self.base));
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    async fn chat(&self, call: &Call) -> Result<Generation, CallError> {
        let mut body = json!({
            "model": self.model,
            "messages": call.messages,
            "max_tokens": call.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let o = body.as_object_mut().expect("object");
        let opt = |v: Option<f32>| v.map(|x| json!(x));
        for (k, v) in [
            ("temperature", opt(call.temperature)),
            ("top_p", opt(call.top_p)),
            ("presence_penalty", opt(call.presence_penalty)),
            ("frequency_penalty", opt(call.frequency_penalty)),
            ("seed", call.seed.map(|s| json!(s))),
            ("stop", call.stop.as_ref().map(|s| json!(s))),
        ] {
            if let Some(v) = v {
                o.insert(k.into(), v);
            }
        }
        let started = Instant::now();
        let mut req = self.client.post(format!("{}/v1/chat/completions", self.base)).json(&body);
        if let Some(k) = &self.key {
            req = req.bearer_auth(k);
        }
        let r = req.send().await.map_err(|e| CallError::Transient(format!("request failed: {e}")))?;
        let status = r.status();
        if status.as_u16() == 429 {
            let retry_after = r
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64);
            return Err(CallError::Overloaded { retry_after });
        }
        if !status.is_success() {
            let text = r.text().await.unwrap_or_default();
            let msg = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(String::from))
                .unwrap_or(text);
            let e = format!("HTTP {}: {msg}", status.as_u16());
            return Err(if status.is_server_error() { CallError::Transient(e) } else { CallError::Failed(e) });
        }
        let mut stream = r.bytes_stream();
        let mut buf = Vec::new();
        let mut g = Generation {
            text: String::new(),
            prompt_tokens: 0,
            completion_tokens: 0,
            ttft: Duration::ZERO,
            latency: Duration::ZERO,
            finish_reason: String::new(),
        };
        let mut first = None;
        let mut done = false;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| CallError::Transient(format!("stream broke: {e}")))?;
            buf.extend_from_slice(&chunk);
            while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(data) = line.trim().strip_prefix("data:") else { continue };
                let data = data.trim();
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let v: Value = serde_json::from_str(data).map_err(|e| CallError::Failed(format!("bad stream chunk: {e}")))?;
                if let Some(err) = v.get("error") {
                    return Err(CallError::Failed(format!("stream error: {}", err["message"].as_str().unwrap_or("unknown"))));
                }
                if let Some(c) = v["choices"].get(0) {
                    if let Some(t) = c["delta"]["content"].as_str() {
                        if !t.is_empty() && first.is_none() {
                            first = Some(started.elapsed());
                        }
                        g.text.push_str(t);
                    }
                    if let Some(f) = c["finish_reason"].as_str() {
                        g.finish_reason = f.to_string();
                    }
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    g.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
                    g.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
                }
            }
        }
        if !done && g.finish_reason.is_empty() {
            return Err(CallError::Transient("the stream ended before the answer finished".into()));
        }
        g.latency = started.elapsed();
        g.ttft = first.unwrap_or(g.latency);
        Ok(g)
    }
}

impl Target {
    pub async fn chat(&self, call: &Call) -> Result<Generation, CallError> {
        match self {
            Target::Http(h) => h.chat(call).await,
            Target::Engine(e) => engine_chat(e, call).await,
        }
    }

    /// In-process: the plan's sequence slots. abserve: its `/ready` plan. Elsewhere `fallback`.
    pub async fn capacity(&self, fallback: usize) -> Capacity {
        match self {
            Target::Engine(e) => Capacity { concurrency: e.plan().seq_slots.max(1) as usize, source: "memory plan".into(), abserve: true },
            Target::Http(h) => {
                let ready = async {
                    let r = h.get("/ready").timeout(Duration::from_secs(30)).send().await.ok()?;
                    let v: Value = r.json().await.ok()?;
                    v["plan"]["seq_slots"].as_u64().filter(|n| *n > 0)
                };
                match ready.await {
                    Some(n) => Capacity { concurrency: n as usize, source: format!("{}/ready", h.base), abserve: true },
                    None => Capacity { concurrency: fallback.max(1), source: "-j".into(), abserve: false },
                }
            }
        }
    }

    /// Resident memory of the process that holds the model, when it can be known.
    pub async fn memory(&self) -> Option<u64> {
        match self {
            Target::Engine(_) => Some(abserve_engine::plan::current_rss()),
            Target::Http(h) => {
                let r = h.get("/metrics").timeout(Duration::from_secs(2)).send().await.ok()?;
                let text = r.text().await.ok()?;
                text.lines().find_map(|l| l.strip_prefix("process_resident_memory_bytes ")?.trim().parse::<f64>().ok()).map(|b| b as u64)
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Target::Engine(e) => format!("in-process engine ({})", e.model_path().display()),
            Target::Http(h) => format!("{} (model '{}')", h.base, h.model),
        }
    }
}

async fn engine_chat(engine: &Engine, call: &Call) -> Result<Generation, CallError> {
    let text = engine.render_chat(&call.messages).map_err(|e| CallError::Failed(format!("chat template: {e}")))?;
    let prompt = engine.tokenize(&text);
    let d = SamplingParams::default();
    let params = SamplingParams {
        temperature: call.temperature.unwrap_or(d.temperature),
        top_p: call.top_p.unwrap_or(d.top_p),
        max_tokens: call.max_tokens,
        seed: call.seed,
        stop: call.stop.clone().unwrap_or_default(),
        presence_penalty: call.presence_penalty.unwrap_or(0.0),
        frequency_penalty: call.frequency_penalty.unwrap_or(0.0),
        // every variant alike reuses cached prompt prefixes (its system prompt is computed once
        // per run, not once per row); see docs/engine.md for what a seed then guarantees
        cache_prompt: Some(true),
        ..d
    };
    if let Err((field, msg)) = params.validate() {
        return Err(CallError::Failed(format!("{field}: {msg}")));
    }
    // a prompt that leaves no room is cut to fit, as the server does for max_tokens
    let context = engine.plan().context as usize;
    let mut params = params;
    if prompt.len() + params.max_tokens as usize > context {
        if prompt.len() >= context {
            return Err(CallError::Failed(format!("prompt of {} tokens does not fit the context of {context}", prompt.len())));
        }
        params.max_tokens = (context - prompt.len()) as u32;
    }
    let started = Instant::now();
    let mut rx = match engine.submit(Request::new(prompt, params)) {
        Ok(rx) => rx,
        Err(SubmitError::QueueFull(_)) => return Err(CallError::Overloaded { retry_after: None }),
        Err(e) => return Err(CallError::Failed(e.to_string())),
    };
    let mut out = String::new();
    let mut first = None;
    loop {
        match rx.recv().await {
            Some(Event::Token { text, .. }) => {
                first.get_or_insert_with(|| started.elapsed());
                out.push_str(&text);
            }
            Some(Event::Done(c)) => {
                out.push_str(&c.tail_text);
                let latency = started.elapsed();
                return Ok(Generation {
                    text: out,
                    prompt_tokens: c.prompt_tokens as u64,
                    completion_tokens: c.completion_tokens as u64,
                    ttft: first.unwrap_or(latency),
                    latency,
                    finish_reason: c.finish_reason.as_str().into(),
                });
            }
            Some(Event::Error(e)) => return Err(CallError::Failed(e)),
            Some(Event::Admitted { .. }) => {}
            None => return Err(CallError::Failed("the engine stopped".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_with_or_without_v1() {
        assert_eq!(super::normalize("http://h:1/v1/"), "http://h:1");
        assert_eq!(super::normalize("http://h:1"), "http://h:1");
    }
}
