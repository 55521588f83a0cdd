//! A second, different kind of registry entry — a model that tokenizes elsewhere, as the next
//! issue's remote endpoints do — served through chat completions (whole and streamed), fan-out,
//! `/v1/models`, `/ready` and `/metrics` beside the fake engine, with nothing outside the
//! registry knowing its kind: the proof that a model of another kind plugs in at one place.
//!
//! [`Echo`] implements only the request-level [`Model`]: it keeps the conversation as its own
//! job (no token ids), answers `echo:` and the last user message word by word, and counts words
//! as its tokens.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

use abserve_engine::prepare::{Input, Options, PrepareError};
use abserve_engine::{
    ChatMessage, Completion, Event, FinishReason, GenerationError, Placement, StatsSnapshot,
    SubmitError,
};
use abserve_models::{Capacity, Entry, Model, Prepared};
use abserve_protocol::{Sampling, Structure};
use futures::future::BoxFuture;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::*;

/// The double's job: what it will answer, and the prompt's length in words.
struct Job {
    reply: Vec<String>,
    prompt_words: usize,
    max_words: usize,
}

#[derive(Default)]
struct Echo {
    probes: AtomicU64,
    probe_fails: AtomicBool,
    completed: AtomicU64,
    generated: AtomicU64,
    /// Every group submitted: its size, fairness group and KV share.
    groups: Mutex<Vec<(usize, Option<String>, Option<f64>)>>,
}

impl Model for Echo {
    fn owned_by(&self) -> &str {
        "test-double"
    }
    fn origin(&self) -> String {
        "a test double".into()
    }
    fn capacity(&self) -> Capacity {
        Capacity {
            context: 100,
            seq_slots: 2,
            max_queue: 2,
        }
    }
    fn stats(&self) -> StatsSnapshot {
        StatsSnapshot {
            completed: self.completed.load(Ordering::SeqCst),
            generated_tokens: self.generated.load(Ordering::SeqCst),
            ..Default::default()
        }
    }
    fn alive(&self) -> Result<(), String> {
        Ok(())
    }
    fn probe(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.probes.fetch_add(1, Ordering::SeqCst);
            match self.probe_fails.load(Ordering::SeqCst) {
                true => Err("the endpoint answered 502".into()),
                false => Ok(()),
            }
        })
    }
    fn prepare(
        &self,
        input: Input<'_>,
        sampling: &Sampling,
        _structure: &Structure,
        options: &Options,
        _max_prompt_tokens: usize,
    ) -> Result<Prepared, PrepareError> {
        let (prompt_words, last) = match input {
            Input::Chat(m) => (
                m.iter().map(|m| m.content.split_whitespace().count()).sum(),
                m.iter()
                    .rev()
                    .find(|m| m.role == "user")
                    .map(|m| m.content.clone()),
            ),
            Input::Text(t) => (t.split_whitespace().count(), Some(t.to_string())),
            Input::Tokens(_) => return Err(PrepareError::new("prompt", "text only")),
        };
        let reply = std::iter::once("echo:".to_string())
            .chain(
                last.unwrap_or_default()
                    .split_whitespace()
                    .map(String::from),
            )
            .collect();
        let max_words = sampling
            .max_tokens
            .map_or(options.default_max_tokens as usize, |n| n as usize);
        let job = Job {
            reply,
            prompt_words,
            max_words,
        };
        Ok(Prepared::new(job, vec![], None))
    }
    fn check(&self, _: &Sampling, _: &Structure, _: &[ChatMessage]) -> Result<(), PrepareError> {
        Ok(())
    }
    fn submit(
        &self,
        seqs: Vec<Prepared>,
        at: Placement,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError> {
        self.groups
            .lock()
            .unwrap()
            .push((seqs.len(), at.group, at.kv_share));
        let mut rxs = vec![];
        for (order, s) in seqs.iter().enumerate() {
            let job = s.job::<Job>().expect("prepared by this model");
            let (tx, rx) = unbounded_channel();
            let _ = tx.send(Event::Admitted {
                queue_time: Duration::ZERO,
                order: order as u64,
            });
            let words = &job.reply[..job.reply.len().min(job.max_words)];
            for (i, w) in words.iter().enumerate() {
                let text = if i == 0 { w.clone() } else { format!(" {w}") };
                let _ = tx.send(Event::Token {
                    token: -1,
                    text,
                    logprob: None,
                });
            }
            if words.is_empty() {
                let _ = tx.send(Event::Error(GenerationError::Decode(
                    "nothing to say".into(),
                )));
            }
            let _ = tx.send(Event::Done(Completion {
                finish_reason: if words.len() < job.reply.len() {
                    FinishReason::Length
                } else {
                    FinishReason::Stop
                },
                prompt_tokens: job.prompt_words,
                completion_tokens: words.len(),
                shared_prompt_tokens: 0,
                preemptions: 0,
                queue_time: Duration::ZERO,
                time_to_first_token: Duration::from_millis(7),
                total_time: Duration::from_millis(20),
                tail_text: String::new(),
                grammar: None,
                cost: None,
            }));
            self.completed.fetch_add(1, Ordering::SeqCst);
            self.generated
                .fetch_add(words.len() as u64, Ordering::SeqCst);
            rxs.push(rx);
        }
        Ok(rxs)
    }
}

/// The fake engine (`fake`, the default) and the double (`echo`); with `experiments`, the
/// A/B layer.
async fn two_kinds(experiments: Option<&str>) -> (App, Arc<Echo>) {
    let echo = Arc::new(Echo::default());
    let entry = Entry {
        id: "echo".into(),
        model: echo.clone(),
    };
    (app_of(experiments, None, vec![entry]).await, echo)
}

#[tokio::test]
async fn models_lists_both_kinds_with_their_owners() {
    let (a, _) = two_kinds(None).await;
    let (status, _, bytes) = a.call("GET", "/v1/models", None, &[]).await;
    assert_eq!(status, StatusCode::OK);
    let list: ModelList = serde_json::from_slice(&bytes).unwrap();
    let ids: Vec<(&str, &str)> = list
        .data
        .iter()
        .map(|m| (m.id.as_str(), m.owned_by.as_str()))
        .collect();
    assert_eq!(ids, [("fake", "abserve"), ("echo", "test-double")]);
}

#[tokio::test]
async fn a_chat_on_the_other_kind_is_answered_with_its_counts() {
    let (a, echo) = two_kinds(None).await;
    let r = a
        .answer(
            "/v1/chat/completions",
            json!({"model": "echo", "messages": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi there you"}]}),
        )
        .await;
    assert_eq!(r.model, "echo");
    assert_eq!(r.choices[0].content(), Some("echo: hi there you"));
    assert_eq!(r.choices[0].finish_reason.as_deref(), Some("stop"));
    let u = r.usage.unwrap();
    // its prompt was never tokenized here: the usage is the model's own count (5 words)
    assert_eq!((u.prompt_tokens, u.completion_tokens), (5, 4));
    assert_eq!(echo.groups.lock().unwrap().as_slice(), [(1, None, None)]);
    // n choices are one group of the double, counted once in the prompt
    let r = a
        .answer(
            "/v1/chat/completions",
            json!({"model": "echo", "n": 2, "max_tokens": 2, "messages": [{"role": "user", "content": "a b c"}]}),
        )
        .await;
    assert_eq!(r.choices.len(), 2);
    assert_eq!(r.choices[1].content(), Some("echo: a"));
    assert_eq!(r.choices[1].finish_reason.as_deref(), Some("length"));
    let u = r.usage.unwrap();
    assert_eq!((u.prompt_tokens, u.completion_tokens), (3, 4));
    assert_eq!(echo.groups.lock().unwrap()[1], (2, None, None));
}

#[tokio::test]
async fn a_streamed_chat_on_the_other_kind_carries_its_usage() {
    let (a, _) = two_kinds(None).await;
    let (status, _, bytes) = a
        .post(
            "/v1/chat/completions",
            json!({"model": "echo", "stream": true, "stream_options": {"include_usage": true},
                   "messages": [{"role": "user", "content": "one two"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (chunks, done) = sse(&bytes);
    assert!(done);
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "echo: one two");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], 2);
    assert_eq!(usage["completion_tokens"], 3);
}

#[tokio::test]
async fn a_fanout_runs_each_variant_on_its_own_kind_of_model() {
    let experiment = r#"
[[experiment]]
name = "kinds"
max_kv_share = 0.5
[[experiment.variants]]
id = "local"
max_tokens = 5
[[experiment.variants]]
id = "remote"
model = "echo"
"#;
    let (a, echo) = two_kinds(Some(experiment)).await;
    let (status, _, bytes) = a
        .post("/v1/experiments/kinds/fanout", json!({"input": "say this"}))
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let f: Value = serde_json::from_slice(&bytes).unwrap();
    let r = f["results"].as_array().unwrap();
    assert_eq!(r[0]["variant"], "local");
    assert_eq!(r[0]["model"], "fake");
    assert_eq!(r[0]["output"], "hello");
    assert_eq!(r[1]["variant"], "remote");
    assert_eq!(r[1]["model"], "echo");
    assert_eq!(r[1]["output"], "echo: say this");
    assert_eq!(r[1]["completion_tokens"], 3);
    // the double ran its variant in the experiment's fairness group, with its share
    assert_eq!(
        echo.groups.lock().unwrap().as_slice(),
        [(1, Some("kinds".to_string()), Some(0.5))]
    );
}

#[tokio::test]
async fn ready_probes_the_other_kind_and_names_it_when_it_fails() {
    let (a, echo) = two_kinds(None).await;
    let (status, _, bytes) = a.call("GET", "/ready", None, &[]).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert_eq!(echo.probes.load(Ordering::SeqCst), 1);
    echo.probe_fails.store(true, Ordering::SeqCst);
    let (status, _, bytes) = a.call("GET", "/ready", None, &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.contains("model 'echo'") && text.contains("502"),
        "{text}"
    );
}

#[tokio::test]
async fn metrics_carry_the_other_kinds_series() {
    let (a, _) = two_kinds(None).await;
    a.answer(
        "/v1/chat/completions",
        json!({"model": "echo", "messages": [{"role": "user", "content": "x y z"}]}),
    )
    .await;
    let (status, _, bytes) = a.call("GET", "/metrics", None, &[]).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8_lossy(&bytes);
    let line = |name: &str, model: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}{{model=\"{model}\"}}")))
            .map(|l| l.rsplit(' ').next().unwrap().to_string())
    };
    use abserve_protocol::names;
    assert_eq!(
        line(names::MODEL_GENERATED_TOKENS, "echo").as_deref(),
        Some("4"),
        "{text}"
    );
    assert_eq!(line(names::MODEL_RUNNING, "echo").as_deref(), Some("0"));
    assert!(line(names::MODEL_RUNNING, "fake").is_some(), "{text}");
}
