//! One HTTP client for OpenAI-compatible endpoints (abserve, vLLM, llama.cpp's server, OpenAI):
//! base URL normalisation, bearer auth, model discovery, `/metrics`, and chat requests streamed
//! with time to first token and inter-token gaps.
//!
//! A streamed answer is complete when `data: [DONE]` arrives, or when a `finish_reason` arrived
//! and the server closed the stream cleanly; anything else is [`ClientError::Incomplete`]. A
//! `data:` payload that is not a JSON chunk is [`ClientError::BadChunk`] (never skipped: a
//! server that sends garbage is not measured as if it answered).

use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::abserve::Ready;
use crate::prometheus::{parse, Samples};
use crate::sse::{SseDecoder, SseEvent};
use crate::wire::{ChatRequest, Chunk, ErrorBody, ModelList, Response, StreamOptions, Usage};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    /// No answer: connection refused or reset, DNS, TLS, or no response in time.
    #[error("request to {url} failed: {message}")]
    Transport {
        url: String,
        message: String,
        timeout: bool,
    },
    /// An HTTP status other than 2xx; `message` is the OpenAI error message when there is one.
    #[error("HTTP {status}: {message}")]
    Status {
        status: u16,
        retry_after: Option<Duration>,
        message: String,
    },
    /// The stream broke after the response started.
    #[error("stream broke: {0}")]
    Stream(String),
    /// A `data:` payload that is not a JSON chunk (or a body that is not the expected JSON).
    #[error("bad response: {0}")]
    BadChunk(String),
    /// The server reported an error inside the stream (`{"error": {...}}`).
    #[error("stream error: {0}")]
    ServerError(String),
    /// The stream ended before `[DONE]` or a finish reason.
    #[error("the stream ended before the answer finished")]
    Incomplete,
}

impl ClientError {
    /// Text of the error as the server worded it (for out-of-memory detection and reports).
    pub fn server_text(&self) -> &str {
        match self {
            ClientError::Status { message, .. } | ClientError::ServerError(message) => message,
            ClientError::Transport { message, .. }
            | ClientError::Stream(message)
            | ClientError::BadChunk(message) => message,
            ClientError::Incomplete => "",
        }
    }
}

/// When the streamed content arrived.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamTiming {
    /// From sending the request to the first non-empty content.
    pub ttft: Option<Duration>,
    /// Between consecutive non-empty content chunks.
    pub gaps: Vec<Duration>,
}

/// A finished chat answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatOutcome {
    pub text: String,
    /// The tools the answer called (`message.tool_calls`, or the streamed deltas joined).
    pub tool_calls: Vec<crate::ToolCall>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    pub timing: StreamTiming,
    pub latency: Duration,
}

/// The endpoint root: trailing `/` and `/v1` removed (`http://h:8080/v1/` → `http://h:8080`).
pub fn normalize_base(url: &str) -> String {
    let u = url.trim_end_matches('/');
    u.strip_suffix("/v1").unwrap_or(u).to_string()
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
}

fn transport(url: &str, e: reqwest::Error) -> ClientError {
    ClientError::Transport {
        url: url.to_string(),
        message: e.to_string(),
        timeout: e.is_timeout(),
    }
}

impl Client {
    /// A client for `url` (with or without `/v1`); `timeout` bounds each whole request.
    pub fn new(url: &str, key: Option<String>, timeout: Duration) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(timeout)
            .build()
            .map_err(|e| transport(url, e))?;
        Ok(Client {
            http,
            base: normalize_base(url),
            key,
        })
    }

    /// The endpoint root, without `/v1`.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn with_auth(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.key {
            Some(k) => r.bearer_auth(k),
            None => r,
        }
    }

    /// `GET {base}{path}` with the API key.
    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.with_auth(self.http.get(format!("{}{path}", self.base)))
    }

    /// `POST {base}{path}` with the API key.
    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.with_auth(self.http.post(format!("{}{path}", self.base)))
    }

    /// The first model id of `GET /v1/models`.
    pub async fn first_model(&self) -> Result<String, ClientError> {
        let url = format!("{}/v1/models", self.base);
        let r = self
            .get("/v1/models")
            .send()
            .await
            .map_err(|e| transport(&url, e))?;
        let r = check(r).await?;
        let list: ModelList = r
            .json()
            .await
            .map_err(|e| ClientError::BadChunk(format!("{url}: {e}")))?;
        list.data
            .into_iter()
            .next()
            .map(|m| m.id)
            .ok_or_else(|| ClientError::BadChunk(format!("{url} lists no model")))
    }

    /// The server's `/metrics`, parsed; `None` when it cannot be had within `timeout`.
    pub async fn metrics(&self, timeout: Duration) -> Option<Samples> {
        let r = self.get("/metrics").timeout(timeout).send().await.ok()?;
        if !r.status().is_success() {
            return None;
        }
        Some(parse(&r.text().await.ok()?))
    }

    /// `GET /ready` (abserve's memory plan is under `plan`); `None` when not abserve, not
    /// ready, or not reachable within `timeout`.
    pub async fn ready(&self, timeout: Duration) -> Option<Ready> {
        let r = self.get("/ready").timeout(timeout).send().await.ok()?;
        r.json().await.ok()
    }

    /// `POST /v1/chat/completions` with `body` (`stream` and `stream_options` are set here).
    /// Streamed: content is timed chunk by chunk. Whole: the time to first token is the latency.
    pub async fn chat(
        &self,
        mut body: ChatRequest,
        stream: bool,
    ) -> Result<ChatOutcome, ClientError> {
        body.common.stream = stream;
        body.common.stream_options = stream.then_some(StreamOptions {
            include_usage: true,
        });
        let url = format!("{}/v1/chat/completions", self.base);
        let sent = Instant::now();
        let r = self
            .post("/v1/chat/completions")
            .json(&body)
            .send()
            .await
            .map_err(|e| transport(&url, e))?;
        let r = check(r).await?;
        if !stream {
            let v: Response = r
                .json()
                .await
                .map_err(|e| ClientError::BadChunk(format!("body: {e}")))?;
            let latency = sent.elapsed();
            let c = v.choices.first();
            return Ok(ChatOutcome {
                text: c.and_then(|c| c.content()).unwrap_or_default().to_string(),
                tool_calls: c
                    .and_then(|c| c.message.as_ref())
                    .and_then(|m| m.tool_calls.clone())
                    .unwrap_or_default(),
                finish_reason: c.and_then(|c| c.finish_reason.clone()),
                usage: v.usage,
                timing: StreamTiming {
                    ttft: Some(latency),
                    gaps: vec![],
                },
                latency,
            });
        }
        let mut a = Assembler {
            sent,
            last: None,
            done: false,
            out: ChatOutcome::default(),
        };
        let mut bytes = r.bytes_stream();
        let mut sse = SseDecoder::new();
        while !a.done {
            match bytes.next().await {
                Some(Ok(b)) => sse.feed(&b).into_iter().try_for_each(|e| a.apply(e))?,
                Some(Err(e)) => return Err(ClientError::Stream(e.to_string())),
                None => {
                    sse.finish().into_iter().try_for_each(|e| a.apply(e))?;
                    break;
                }
            }
        }
        if !a.done && a.out.finish_reason.is_none() {
            return Err(ClientError::Incomplete);
        }
        a.out.latency = sent.elapsed();
        Ok(a.out)
    }
}

/// Builds a [`ChatOutcome`] from stream events.
struct Assembler {
    sent: Instant,
    last: Option<Instant>,
    done: bool,
    out: ChatOutcome,
}

impl Assembler {
    /// Joins a streamed piece of a tool call into the call of its index.
    fn tool_delta(&mut self, d: &crate::ToolCallDelta) {
        let calls = &mut self.out.tool_calls;
        let i = d.index as usize;
        while calls.len() <= i {
            calls.push(crate::ToolCall {
                id: String::new(),
                kind: "function".into(),
                function: crate::FunctionCall {
                    name: String::new(),
                    arguments: String::new(),
                },
            });
        }
        let c = &mut calls[i];
        if let Some(id) = &d.id {
            c.id.clone_from(id);
        }
        c.function
            .name
            .push_str(d.function.name.as_deref().unwrap_or_default());
        c.function
            .arguments
            .push_str(d.function.arguments.as_deref().unwrap_or_default());
    }

    fn apply(&mut self, e: SseEvent) -> Result<(), ClientError> {
        let data = match e {
            SseEvent::Done => {
                self.done = true;
                return Ok(());
            }
            SseEvent::Data(d) => d,
        };
        let chunk: Chunk = serde_json::from_str(&data).map_err(|e| {
            ClientError::BadChunk(format!(
                "{e}: {}",
                data.chars().take(200).collect::<String>()
            ))
        })?;
        if let Some(err) = chunk.error {
            return Err(ClientError::ServerError(err.message));
        }
        if let Some(c) = chunk.choices.first() {
            if let Some(t) = c.content().filter(|t| !t.is_empty()) {
                let now = Instant::now();
                match self.last {
                    None => self.out.timing.ttft = Some(now - self.sent),
                    Some(l) => self.out.timing.gaps.push(now - l),
                }
                self.last = Some(now);
                self.out.text.push_str(t);
            }
            for d in c.delta.iter().flat_map(|d| d.tool_calls.iter().flatten()) {
                self.tool_delta(d);
            }
            if c.finish_reason.is_some() {
                self.out.finish_reason = c.finish_reason.clone();
            }
        }
        if chunk.usage.is_some() {
            self.out.usage = chunk.usage;
        }
        Ok(())
    }
}

/// A non-2xx response as [`ClientError::Status`], with `Retry-After` (seconds) and the OpenAI
/// error message when the body has one.
async fn check(r: reqwest::Response) -> Result<reqwest::Response, ClientError> {
    let status = r.status();
    if status.is_success() {
        return Ok(r);
    }
    let retry_after = r
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    let text = r.text().await.unwrap_or_default();
    let message = serde_json::from_str::<ErrorBody>(&text)
        .map(|b| b.error.message)
        .unwrap_or(text);
    Err(ClientError::Status {
        status: status.as_u16(),
        retry_after,
        message,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn urls_with_or_without_v1() {
        assert_eq!(super::normalize_base("http://h:1/v1/"), "http://h:1");
        assert_eq!(super::normalize_base("http://h:1"), "http://h:1");
        assert_eq!(super::normalize_base("http://h:1/"), "http://h:1");
    }
}
