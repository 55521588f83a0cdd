//! One request of a load test and what became of it. Every failure lands in exactly one class;
//! a response that mentions running out of memory is counted as `oom` whatever its status.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Ok,
    Http429,
    Http4xx,
    Http5xx,
    Timeout,
    Connection,
    /// The answer (status body or a stream error) says the server ran out of memory.
    Oom,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Ok => "ok",
            Class::Http429 => "http_429",
            Class::Http4xx => "http_4xx",
            Class::Http5xx => "http_5xx",
            Class::Timeout => "timeout",
            Class::Connection => "connection",
            Class::Oom => "oom",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Record {
    pub class: Class,
    pub status: Option<u16>,
    /// Seconds since the run began when the request was sent.
    pub sent_at: f64,
    pub ttft: Option<f64>,
    pub latency: f64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Gaps between streamed content chunks (seconds).
    #[serde(skip)]
    pub itl: Vec<f64>,
    pub retry_after: Option<f64>,
    pub message: Option<String>,
}

/// True when a message says memory ran out (CUDA, llama.cpp, allocators, our own wording).
pub fn mentions_oom(text: &str) -> bool {
    let t = text.to_lowercase();
    ["out of memory", "outofmemory", "oom", "failed to allocate", "cannot allocate memory", "memory exhausted"]
        .iter()
        .any(|k| if *k == "oom" { t.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w == "oom") } else { t.contains(k) })
}

pub struct Client {
    pub http: reqwest::Client,
    pub url: String,
    pub key: Option<String>,
    pub timeout: Duration,
}

impl Client {
    /// Sends one chat request (`body` without `stream`) and records what happened.
    pub async fn send(&self, mut body: Value, stream: bool, t0: Instant) -> Record {
        let sent = Instant::now();
        let mut rec = Record {
            class: Class::Ok,
            status: None,
            sent_at: (sent - t0).as_secs_f64(),
            ttft: None,
            latency: 0.0,
            prompt_tokens: 0,
            completion_tokens: 0,
            itl: Vec::new(),
            retry_after: None,
            message: None,
        };
        body["stream"] = Value::Bool(stream);
        if stream {
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        let work = self.exchange(body, stream, sent, &mut rec);
        if tokio::time::timeout(self.timeout, work).await.is_err() {
            rec.class = Class::Timeout;
            rec.message = Some(format!("no complete answer within {:.0} s", self.timeout.as_secs_f64()));
        }
        rec.latency = sent.elapsed().as_secs_f64();
        rec
    }

    async fn exchange(&self, body: Value, stream: bool, sent: Instant, rec: &mut Record) {
        let mut req = self.http.post(format!("{}/v1/chat/completions", self.url)).json(&body);
        if let Some(k) = &self.key {
            req = req.bearer_auth(k);
        }
        let r = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                rec.class = if e.is_timeout() { Class::Timeout } else { Class::Connection };
                rec.message = Some(e.to_string());
                return;
            }
        };
        let status = r.status().as_u16();
        rec.status = Some(status);
        if status != 200 {
            rec.retry_after = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|s| s.parse().ok());
            let text = r.text().await.unwrap_or_default();
            rec.class = match status {
                _ if mentions_oom(&text) => Class::Oom,
                429 => Class::Http429,
                400..=499 => Class::Http4xx,
                _ => Class::Http5xx,
            };
            rec.message = Some(text.chars().take(300).collect());
            return;
        }
        if !stream {
            match r.json::<Value>().await {
                Ok(v) => {
                    rec.prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
                    rec.completion_tokens = v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
                    rec.ttft = Some(sent.elapsed().as_secs_f64());
                }
                Err(e) => {
                    rec.class = Class::Connection;
                    rec.message = Some(format!("body: {e}"));
                }
            }
            return;
        }
        let mut s = r.bytes_stream();
        let mut buf = Vec::new();
        let mut last: Option<Instant> = None;
        let mut done = false;
        while let Some(chunk) = s.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    rec.class = Class::Connection;
                    rec.message = Some(format!("stream broke: {e}"));
                    return;
                }
            };
            buf.extend_from_slice(&chunk);
            while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(data) = line.trim().strip_prefix("data:").map(str::trim) else { continue };
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let Ok(v) = serde_json::from_str::<Value>(data) else { continue };
                if let Some(err) = v.get("error") {
                    let m = err["message"].as_str().unwrap_or("stream error").to_string();
                    rec.class = if mentions_oom(&m) { Class::Oom } else { Class::Http5xx };
                    rec.message = Some(m);
                    return;
                }
                if v["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty()) {
                    let now = Instant::now();
                    match last {
                        None => rec.ttft = Some((now - sent).as_secs_f64()),
                        Some(l) => rec.itl.push((now - l).as_secs_f64()),
                    }
                    last = Some(now);
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    rec.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
                    rec.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
                }
            }
        }
        if !done {
            rec.class = Class::Connection;
            rec.message = Some("the stream ended without [DONE]".into());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn oom_wording() {
        for t in ["CUDA out of memory. Tried to allocate", "ggml: failed to allocate buffer", "OOM killed", "error: oom"] {
            assert!(super::mentions_oom(t), "{t}");
        }
        for t in ["room for more", "zoom", "all good"] {
            assert!(!super::mentions_oom(t), "{t}");
        }
    }
}
