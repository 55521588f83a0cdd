//! One request of a load test and what became of it. Every failure lands in exactly one class;
//! a response that mentions running out of memory is counted as `oom` whatever its status. A
//! stream that breaks, ends early or sends a chunk that is not JSON is a `connection` failure
//! (the protocol crate's one rule for streams).

use std::time::{Duration, Instant};

use abserve_protocol::wire::ChatRequest;
use abserve_protocol::ClientError;
use serde::Serialize;

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
    [
        "out of memory",
        "outofmemory",
        "oom",
        "failed to allocate",
        "cannot allocate memory",
        "memory exhausted",
    ]
    .iter()
    .any(|k| {
        if *k == "oom" {
            t.split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| w == "oom")
        } else {
            t.contains(k)
        }
    })
}

/// Sends load-test requests through the shared OpenAI client and classifies what came back.
pub struct Client {
    pub api: abserve_protocol::Client,
    pub timeout: Duration,
}

impl Client {
    /// Sends one chat request (`body` without `stream`) and records what happened.
    pub async fn send(&self, body: ChatRequest, stream: bool, t0: Instant) -> Record {
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
        match tokio::time::timeout(self.timeout, self.api.chat(body, stream)).await {
            Err(_) => {
                rec.class = Class::Timeout;
                rec.message = Some(format!(
                    "no complete answer within {:.0} s",
                    self.timeout.as_secs_f64()
                ));
            }
            Ok(Ok(out)) => {
                rec.status = Some(200);
                let usage = out.usage.unwrap_or_default();
                rec.prompt_tokens = usage.prompt_tokens;
                rec.completion_tokens = usage.completion_tokens;
                rec.ttft = out.timing.ttft.map(|d| d.as_secs_f64());
                rec.itl = out.timing.gaps.iter().map(Duration::as_secs_f64).collect();
            }
            Ok(Err(e)) => classify(&e, &mut rec),
        }
        rec.latency = sent.elapsed().as_secs_f64();
        rec
    }
}

/// The class of a failed request; a server text that mentions running out of memory is `Oom`
/// whatever the status.
fn classify(e: &ClientError, rec: &mut Record) {
    rec.class = match e {
        _ if mentions_oom(e.server_text()) => Class::Oom,
        ClientError::Transport { timeout: true, .. } => Class::Timeout,
        ClientError::Transport { .. }
        | ClientError::Stream(_)
        | ClientError::Incomplete
        | ClientError::BadChunk(_) => Class::Connection,
        ClientError::Status { status: 429, .. } => Class::Http429,
        ClientError::Status {
            status: 400..=499, ..
        } => Class::Http4xx,
        ClientError::Status { .. } | ClientError::ServerError(_) => Class::Http5xx,
    };
    if let ClientError::Status {
        status,
        retry_after,
        ..
    } = e
    {
        rec.status = Some(*status);
        rec.retry_after = retry_after.map(|d| d.as_secs_f64());
    }
    rec.message = Some(e.to_string().chars().take(300).collect());
}

#[cfg(test)]
mod tests {
    #[test]
    fn oom_wording() {
        for t in [
            "CUDA out of memory. Tried to allocate",
            "ggml: failed to allocate buffer",
            "OOM killed",
            "error: oom",
        ] {
            assert!(super::mentions_oom(t), "{t}");
        }
        for t in ["room for more", "zoom", "all good"] {
            assert!(!super::mentions_oom(t), "{t}");
        }
    }
}
