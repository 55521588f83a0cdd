//! The routes without a model: the router over [`fake::Fake`], called in-process. Each test
//! checks what a client sees (status, OpenAI's shapes, exact token counts) and what reached the
//! engine.

mod elsewhere;
mod engine_death;
mod evals;
mod experiments;
mod fake;
mod ops;
mod roles;
mod samples;
mod structured;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use abserve_protocol::wire::{Chunk, ErrorBody, ModelList, Response as WireResponse};
use abserve_protocol::{SseDecoder, SseEvent};
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tower::ServiceExt;

use self::fake::{Control, Fake, ANSWER};
use crate::{router, AbState, AppState, Metrics, ServerConfig};

struct App {
    router: Router,
    state: Arc<AppState>,
    ctl: Arc<Control>,
    dir: Option<PathBuf>,
}

impl Drop for App {
    fn drop(&mut self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A server over a fake engine; with `experiments` (TOML), an A/B store in a fresh directory.
async fn app(experiments: Option<&str>) -> App {
    app_with(experiments, None).await
}

async fn app_with(
    experiments: Option<&str>,
    device: Option<Arc<abserve_engine::device::FakeDevice>>,
) -> App {
    app_of(experiments, device, vec![]).await
}

/// A server over the fake engine (model `fake`, the default) and the registry entries `others`.
async fn app_of(
    experiments: Option<&str>,
    device: Option<Arc<abserve_engine::device::FakeDevice>>,
    others: Vec<abserve_models::Entry>,
) -> App {
    app_keyed(experiments, device, others, crate::keys::Keys::open()).await
}

/// [`app_of`] whose `/v1` routes take the keys `keys`.
async fn app_keyed(
    experiments: Option<&str>,
    device: Option<Arc<abserve_engine::device::FakeDevice>>,
    others: Vec<abserve_models::Entry>,
    keys: crate::keys::Keys,
) -> App {
    let ctl = Arc::new(Control::default());
    let fake = Fake::with_device(ctl.clone(), device);
    let stats = Arc::new(abserve_engine::EngineStats::default());
    let metrics = Metrics::new(
        abserve_models::EngineApi::plan(&fake),
        stats,
        Metrics::engine_step_histogram().unwrap(),
        abserve_models::EngineApi::device(&fake),
    )
    .unwrap();
    let config = ServerConfig {
        queue_timeout: Duration::from_secs(5),
        keys: Arc::new(keys),
        body_limit: 1 << 20,
        max_prompt_tokens: 400,
        ready_cache: Duration::ZERO,
        drain_timeout: Duration::from_secs(1),
        header_read_timeout: Duration::from_secs(5),
        cors_origins: vec![],
        guardrail_interval: Duration::from_secs(10),
    };
    let (ab, dir) = match experiments {
        Some(toml) => {
            let r: u64 = rand::random();
            let dir = std::env::temp_dir().join(format!("abserve-server-test-{r:016x}"));
            std::fs::create_dir_all(&dir).unwrap();
            let file = dir.join("experiments.toml");
            std::fs::write(&file, toml).unwrap();
            (
                Some(
                    AbState::open(
                        &abserve_protocol::location::Location::Sqlite(dir.join("abserve.db")),
                        Some(&file),
                        false,
                        Duration::from_secs(2),
                    )
                    .await
                    .unwrap(),
                ),
                Some(dir),
            )
        }
        None => (None, None),
    };
    let fake = abserve_models::Entry {
        id: "fake".into(),
        model: Arc::new(abserve_models::Local(fake)),
    };
    let models =
        abserve_models::Registry::new(std::iter::once(fake).chain(others).collect()).unwrap();
    let state = AppState::new(models, metrics, config, ab);
    App {
        router: router(state.clone()),
        state,
        ctl,
        dir,
    }
}

impl App {
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, HeaderMap, Vec<u8>) {
        let mut r = Request::builder().method(method).uri(path);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let body = match body {
            Some(v) => Body::from(v.to_string()),
            None => Body::empty(),
        };
        let resp = self
            .router
            .clone()
            .oneshot(r.body(body).unwrap())
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        (parts.status, parts.headers, bytes.to_vec())
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, HeaderMap, Vec<u8>) {
        self.call(
            "POST",
            path,
            Some(body),
            &[("content-type", "application/json")],
        )
        .await
    }

    /// A whole answer that must be a 200 (the body is the failure's message), parsed.
    async fn answer(&self, path: &str, body: Value) -> WireResponse {
        let (status, _, bytes) = self.post(path, body).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        serde_json::from_slice(&bytes).unwrap()
    }

    /// An OpenAI error answer: its status, `param` and message.
    async fn error(&self, path: &str, body: Value) -> (StatusCode, Option<String>, String) {
        let (status, _, bytes) = self.post(path, body).await;
        let e: ErrorBody = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("not an OpenAI error: {}", String::from_utf8_lossy(&bytes)));
        (status, e.error.param, e.error.message)
    }
}

/// The `data:` payloads of a streamed body, and whether it ended with `[DONE]`.
fn sse(bytes: &[u8]) -> (Vec<Value>, bool) {
    let mut d = SseDecoder::new();
    let mut events = d.feed(bytes);
    events.extend(d.finish());
    let done = matches!(events.last(), Some(SseEvent::Done));
    let data = events
        .into_iter()
        .filter_map(|e| match e {
            SseEvent::Data(s) => Some(serde_json::from_str(&s).unwrap()),
            SseEvent::Done => None,
        })
        .collect();
    (data, done)
}

/// Prompt tokens of one user message `m` under the fake's template.
fn chat_prompt_len(m: &str) -> u64 {
    format!("user: {m}\nassistant:").len() as u64
}

#[tokio::test]
async fn a_whole_chat_answer_has_openais_shape_and_exact_usage() {
    let a = app(None).await;
    let (status, _, bytes) =
        a.post("/v1/chat/completions", json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let raw: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        raw["choices"][0]["logprobs"],
        Value::Null,
        "OpenAI sends logprobs: null"
    );
    assert!(
        raw["choices"][0].get("text").is_none(),
        "a chat choice has no text field"
    );
    let r: WireResponse = serde_json::from_value(raw).unwrap();
    assert!(r.id.starts_with("chatcmpl-"));
    assert_eq!(
        (r.object.as_str(), r.model.as_str()),
        ("chat.completion", "fake")
    );
    assert_eq!(r.choices[0].content(), Some("hello"));
    assert_eq!(r.choices[0].finish_reason.as_deref(), Some("length"));
    let u = r.usage.unwrap();
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens, u.total_tokens),
        (chat_prompt_len("hi"), 5, chat_prompt_len("hi") + 5)
    );
    assert_eq!(u.prompt_tokens_details.unwrap().cached_tokens, 0);
    assert!(r.abserve.is_none(), "no routing field outside experiments");
    // the engine got the rendered template without a second BOS, and the caller's max_tokens
    let sub = a.ctl.submitted.lock().unwrap();
    assert_eq!(sub[0].prompt.len() as u64, chat_prompt_len("hi"));
    assert_eq!(sub[0].params.max_tokens, 5);
}

#[tokio::test]
async fn a_streamed_chat_is_role_then_content_then_finish_then_usage_then_done() {
    let a = app(None).await;
    let body = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": true,
                      "stream_options": {"include_usage": true}, "n": 2});
    let (status, headers, bytes) = a.post("/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let (data, done) = sse(&bytes);
    assert!(done, "the stream ends with [DONE]");
    let chunks: Vec<Chunk> = data
        .iter()
        .map(|v| serde_json::from_value(v.clone()).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c.object == "chat.completion.chunk" && c.id == chunks[0].id));
    // one role chunk per choice, first
    for (i, c) in chunks[..2].iter().enumerate() {
        assert_eq!(c.choices[0].index as usize, i);
        assert_eq!(
            c.choices[0].delta.as_ref().unwrap().role.as_deref(),
            Some("assistant")
        );
    }
    for i in 0..2u32 {
        let mine: Vec<&Chunk> = chunks
            .iter()
            .filter(|c| c.choices.first().is_some_and(|x| x.index == i))
            .collect();
        let text: String = mine.iter().filter_map(|c| c.choices[0].content()).collect();
        assert_eq!(text.as_bytes(), ANSWER, "choice {i}");
        let finishes: Vec<_> = mine
            .iter()
            .filter_map(|c| c.choices[0].finish_reason.as_deref())
            .collect();
        assert_eq!(finishes, ["stop"], "choice {i}: one finish chunk");
    }
    let last = chunks.last().unwrap();
    assert!(last.choices.is_empty());
    let u = last.usage.unwrap();
    // n copies of one prompt count once, as OpenAI counts them
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens),
        (chat_prompt_len("hi"), 2 * ANSWER.len() as u64)
    );
    assert_eq!(
        data.iter().filter(|v| v.get("usage").is_some()).count(),
        1,
        "usage only in the last chunk"
    );
}

#[tokio::test]
async fn completions_take_token_prompts_n_and_logprobs_in_the_completions_shape() {
    let a = app(None).await;
    let body = json!({"model": "fake", "prompt": [[72, 105], [33]], "n": 2, "max_tokens": 3, "logprobs": 2});
    let (status, _, bytes) = a.post("/v1/completions", body).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let r: WireResponse = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(r.object, "text_completion");
    assert_eq!(r.choices.len(), 4, "2 prompts × n=2");
    assert!(r.choices.iter().all(|c| c.content() == Some("hel")));
    match &r.choices[0].logprobs {
        Some(abserve_protocol::wire::Logprobs::Text(t)) => {
            assert_eq!(t.tokens, ["h", "e", "l"]);
            assert_eq!(t.text_offset, [0, 1, 2]);
            assert_eq!(
                t.top_logprobs[0].len(),
                1,
                "the fake's two alternatives are the same token"
            );
        }
        other => panic!("completions logprobs expected, got {other:?}"),
    }
    assert_eq!(r.usage.unwrap().prompt_tokens, 3);
    let sub = a.ctl.submitted.lock().unwrap();
    let prompts: Vec<&[i32]> = sub.iter().map(|r| r.prompt.as_slice()).collect();
    assert_eq!(prompts, [&[72, 105][..], &[72, 105], &[33], &[33]]);
}

#[tokio::test]
async fn bad_requests_are_openai_errors_naming_the_parameter() {
    let a = app(None).await;
    let chat = |extra: Value| {
        let mut b = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}]});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let cases: Vec<(&str, Value, StatusCode, Option<&str>)> = vec![
        (
            "/v1/chat/completions",
            chat(json!({"n": 0})),
            StatusCode::BAD_REQUEST,
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 0})),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 10_000})),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"stop": ["a", "b", "c", "d", "e"]})),
            StatusCode::BAD_REQUEST,
            Some("stop"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_logprobs": 3})),
            StatusCode::BAD_REQUEST,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"model": "gpt-9"})),
            StatusCode::NOT_FOUND,
            Some("model"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "fake", "messages": []}),
            StatusCode::BAD_REQUEST,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "fake", "messages": [{"role": "king", "content": "x"}]}),
            StatusCode::BAD_REQUEST,
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "fake", "messages": [{"role": "user", "content": "x".repeat(450)}]}),
            StatusCode::BAD_REQUEST,
            Some("messages"),
        ),
        (
            "/v1/completions",
            json!({"model": "fake", "prompt": [300]}),
            StatusCode::BAD_REQUEST,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"model": "fake", "prompt": "x", "echo": true}),
            StatusCode::BAD_REQUEST,
            Some("echo"),
        ),
        (
            "/v1/completions",
            json!({"model": "fake", "prompt": []}),
            StatusCode::BAD_REQUEST,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x"}),
            StatusCode::BAD_REQUEST,
            Some("model"),
        ),
        (
            "/v1/chat/completions",
            json!([1, 2]),
            StatusCode::BAD_REQUEST,
            None,
        ),
    ];
    for (path, body, status, param) in cases {
        let (s, p, message) = a.error(path, body.clone()).await;
        assert_eq!((s, p.as_deref()), (status, param), "{body}: {message}");
        assert!(!message.is_empty());
    }
    let (s, _, bytes) = a
        .call(
            "POST",
            "/v1/chat/completions",
            None,
            &[("content-type", "application/json")],
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        serde_json::from_slice::<ErrorBody>(&bytes).is_ok(),
        "an empty body is an OpenAI error too"
    );
    // a body not declared as JSON (a cross-site form post) is refused before it is read
    let body = Some(json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}));
    let (s, _, bytes) = a
        .call(
            "POST",
            "/v1/chat/completions",
            body,
            &[("content-type", "text/plain")],
        )
        .await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(serde_json::from_slice::<ErrorBody>(&bytes).is_ok());
    assert!(
        a.ctl.submitted.lock().unwrap().is_empty(),
        "nothing invalid reached the engine"
    );
}

#[tokio::test]
async fn a_full_queue_is_429_with_retry_after_and_a_dead_engine_fails_health() {
    let a = app(None).await;
    a.ctl.queue_full.store(true, Ordering::SeqCst);
    let (s, headers, bytes) = a
        .post(
            "/v1/chat/completions",
            json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    let secs: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(secs >= 1);
    let e: ErrorBody = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(e.error.kind.as_deref(), Some("rate_limit_exceeded"));
    assert_eq!(a.call("GET", "/health", None, &[]).await.0, StatusCode::OK);
    a.ctl.dead.store(true, Ordering::SeqCst);
    assert_eq!(
        a.call("GET", "/health", None, &[]).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        a.call("GET", "/ready", None, &[]).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let (s, _, bytes) = a.call("GET", "/v1/models", None, &[]).await;
    assert_eq!(s, StatusCode::OK);
    let models: ModelList = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        (models.object.as_str(), models.data[0].id.as_str()),
        ("list", "fake")
    );
}

#[tokio::test]
async fn a_generation_that_fails_is_an_error_chunk_in_a_stream_and_a_503_whole() {
    let a = app(None).await;
    a.ctl.fail.store(true, Ordering::SeqCst);
    let body = json!({"model": "fake", "messages": [{"role": "user", "content": "hi"}]});
    let (s, _, bytes) = a.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(serde_json::from_slice::<ErrorBody>(&bytes)
        .unwrap()
        .error
        .message
        .contains("fake failure"));
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let (s, _, bytes) = a.post("/v1/chat/completions", streamed).await;
    assert_eq!(s, StatusCode::OK, "the stream had started");
    let (data, done) = sse(&bytes);
    let err: ErrorBody = serde_json::from_value(data.last().unwrap().clone()).unwrap();
    assert!(err.error.message.contains("fake failure"));
    assert_eq!(err.error.kind.as_deref(), Some("server_error"));
    assert!(done);
    let (_, _, m) = a.call("GET", "/metrics", None, &[]).await;
    let m = abserve_protocol::parse_prometheus(&String::from_utf8(m).unwrap());
    assert_eq!(
        m.get("abserve_generation_errors_total{kind=\"decode\"}"),
        Some(2.0),
        "both failures counted"
    );
}
