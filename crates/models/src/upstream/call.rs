//! One request at an upstream, relayed as engine events: `Token` for each piece of text as it
//! arrives, `Done` with the upstream's own usage (asked with `stream_options.include_usage`),
//! or `Error` with the status abserve answers and the upstream named.
//!
//! Retries: a request the upstream refused for load (429, 503) or that could not reach it
//! (connect error, no first byte within the first-token timeout, a 502/504 of its proxy) is
//! sent again — after its `Retry-After`, else an exponential backoff with jitter — at most
//! `retries` times, only while nothing has reached the client and within the total timeout;
//! with several URLs, the retry goes at once to another replica that has room (the request's
//! reservation moves there).
//! Every failure for the upstream's sake counts against the URL's breaker; a refusal of the
//! request itself (400, 422) does not.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use abserve_engine::{Class, Completion, Event, GenerationError};
use abserve_protocol::{SseDecoder, SseEvent};
use futures::StreamExt;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::UnboundedSender;

use super::anthropic;
use super::openai::OpenaiStream;
use super::pool::{Replica, Reservation};
use super::relay::{refusal_text, Relay};
use super::{discover, Protocol, Shared};

/// A reqwest error's words without the URL (said once, by the caller).
pub(crate) fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s
            .replace(&format!(" ({u})"), "")
            .replace(u.as_str(), "the upstream");
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}

/// How a try ended.
enum Failure {
    /// Worth another try (load, unreachable, a stall before the first byte); `after` is the
    /// upstream's Retry-After.
    Retry {
        error: GenerationError,
        after: Option<Duration>,
    },
    /// Final: the request's own fault, or a failure after text reached the client.
    Final {
        error: GenerationError,
        upstream_fault: bool,
    },
    /// The client went away.
    Cancelled,
}

fn err(status: u16, message: String) -> GenerationError {
    GenerationError::Upstream { status, message }
}

fn class(status: u16) -> &'static str {
    match status {
        400 => "refused",
        502 => "bad_answer",
        504 => "timeout",
        _ => "unavailable",
    }
}

/// How the tries of a request ended: its completion and time to first token, or the error
/// and whether it was the upstream's fault (a 499 is the client gone).
type Outcome = Result<(Completion, Option<Duration>), (GenerationError, bool)>;

/// Runs one admitted request to its end on the replica its reservation holds (counted in
/// `running` by its admission, given back here).
pub(crate) async fn run(
    sh: Arc<Shared>,
    reservation: Reservation,
    body: Map<String, Value>,
    tx: UnboundedSender<Event>,
    queue_time: Duration,
) {
    let started = Instant::now();
    let mut reservation = reservation;
    let outcome = tries(&sh, &mut reservation, &body, &tx, started).await;
    let replica = &sh.pool.replicas[reservation.replica];
    settle(&sh, replica, outcome, &tx, queue_time, started);
    sh.running.fetch_sub(1, Ordering::SeqCst);
    replica.show_breaker(&sh.series);
    drop(reservation);
    sh.pool.poke();
}

/// Sends the request, again after a failure worth a retry (see the module's rules): at once on
/// another replica when one has room (the reservation moves there), else on the same one after
/// the backoff.
async fn tries(
    sh: &Shared,
    reservation: &mut Reservation,
    body: &Map<String, Value>,
    tx: &UnboundedSender<Event>,
    started: Instant,
) -> Outcome {
    let (_, _, total) = sh.config.timeouts();
    let deadline = started + total;
    let mut attempt = 0;
    loop {
        let replica = &sh.pool.replicas[reservation.replica];
        let mut relay = Relay::new(tx, started);
        let r = tokio::select! {
            r = tokio::time::timeout_at(deadline.into(), one_try(sh, &replica.url, body, &mut relay)) => match r {
                Ok(r) => r,
                Err(_) => Err(Failure::Final {
                    error: err(504, format!("'{}' did not finish within the total timeout of {:?}.", sh.id, total)),
                    upstream_fault: true,
                }),
            },
            _ = tx.closed() => Err(Failure::Cancelled),
        };
        match r {
            Err(Failure::Retry { error, after }) if attempt < sh.config.retries && !relay.sent => {
                replica.breaker.failed(Instant::now());
                replica.show_breaker(&sh.series);
                attempt += 1;
                sh.series.retries.inc();
                if let Some(other) = sh.pool.elsewhere(reservation) {
                    *reservation = other;
                    continue;
                }
                let backoff = after.unwrap_or_else(|| backoff(attempt));
                if Instant::now() + backoff >= deadline {
                    return Err((error, true));
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => continue,
                    _ = tx.closed() => return Err((err(499, "cancelled".into()), false)),
                }
            }
            Err(Failure::Retry { error, .. }) => return Err((error, true)),
            Err(Failure::Final {
                error,
                upstream_fault,
            }) => return Err((error, upstream_fault)),
            Err(Failure::Cancelled) => return Err((err(499, "cancelled".into()), false)),
            Ok(done) => return Ok((done, relay.ttft)),
        }
    }
}

/// The last event of a request, its counts and series, and what it tells the breaker.
fn settle(
    sh: &Shared,
    replica: &Replica,
    outcome: Outcome,
    tx: &UnboundedSender<Event>,
    queue_time: Duration,
    started: Instant,
) {
    match outcome {
        Ok((mut done, ttft)) => {
            replica.breaker.succeeded();
            done.queue_time = queue_time;
            done.total_time = started.elapsed();
            done.time_to_first_token = ttft.unwrap_or(done.total_time);
            let c = &sh.counters;
            c.completed.fetch_add(1, Ordering::SeqCst);
            c.prompt_tokens
                .fetch_add(done.prompt_tokens as u64, Ordering::SeqCst);
            c.generated_tokens
                .fetch_add(done.completion_tokens as u64, Ordering::SeqCst);
            let spend = (done.prompt_tokens as f64 * sh.config.input_price
                + done.completion_tokens as f64 * sh.config.output_price)
                / 1e6;
            sh.series.spend.inc_by(spend);
            done.cost = sh.config.priced().then_some(spend);
            sh.series.latency.observe(done.total_time.as_secs_f64());
            sh.series
                .ttft
                .observe(done.time_to_first_token.as_secs_f64());
            let _ = tx.send(Event::Done(done));
        }
        Err((_, _)) if tx.is_closed() => replica.breaker.abandoned(),
        Err((e, upstream_fault)) => {
            let status = match &e {
                GenerationError::Upstream { status, .. } => *status,
                _ => 502,
            };
            if status == 499 {
                replica.breaker.abandoned();
                return;
            }
            if upstream_fault {
                replica.breaker.failed(Instant::now());
            } else {
                replica.breaker.succeeded();
            }
            sh.series.errors.with_label_values(&[class(status)]).inc();
            let _ = tx.send(Event::Error(e));
        }
    }
}

/// 0.25 s × 2^(attempt−1), ± 25 % jitter, at most 8 s.
fn backoff(attempt: u32) -> Duration {
    let base = 0.25 * 2f64.powi(attempt.saturating_sub(1).min(5) as i32);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let jitter = 0.75 + 0.5 * (nanos % 1000) as f64 / 1000.0;
    Duration::from_secs_f64((base * jitter).min(8.0))
}

/// The Retry-After of an answer, in seconds (the HTTP-date form is not used by these APIs).
fn retry_after(r: &reqwest::Response) -> Option<Duration> {
    let s = r.headers().get("retry-after")?.to_str().ok()?;
    let secs: f64 = s.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(60.0)))
}

/// One request to `url`, its answer relayed.
async fn one_try(
    sh: &Shared,
    url: &str,
    body: &Map<String, Value>,
    relay: &mut Relay<'_>,
) -> Result<Completion, Failure> {
    let resp = send(sh, url, body).await?;
    read(sh, resp, relay).await
}

/// Sends the request; an answer other than 200 is the failure it stands for.
async fn send(
    sh: &Shared,
    url: &str,
    body: &Map<String, Value>,
) -> Result<reqwest::Response, Failure> {
    let (_, first, _) = sh.config.timeouts();
    let id = &sh.id;
    let req = match sh.config.protocol {
        Protocol::Openai => {
            let mut b = body.clone();
            b.insert("model".into(), json!(sh.model));
            b.insert("stream".into(), json!(true));
            b.insert("stream_options".into(), json!({"include_usage": true}));
            sh.http
                .post(format!("{}/chat/completions", discover::base(url)))
                .json(&b)
        }
        Protocol::Anthropic => {
            let b = anthropic::request(&sh.model, body).map_err(|m| Failure::Final {
                error: err(400, format!("'{id}': {m}")),
                upstream_fault: false,
            })?;
            sh.http
                .post(format!("{}/v1/messages", discover::root(url)))
                .json(&b)
        }
    };
    let resp = match tokio::time::timeout(first, req.send()).await {
        Err(_) => {
            return Err(Failure::Retry {
                error: err(
                    504,
                    format!("'{id}' did not answer within the first-token timeout of {first:?}."),
                ),
                after: None,
            })
        }
        Ok(Err(e)) => {
            return Err(Failure::Retry {
                error: err(
                    503,
                    format!("'{id}' could not be reached: {}.", without_url(&e)),
                ),
                after: None,
            })
        }
        Ok(Ok(r)) => r,
    };
    let status = resp.status().as_u16();
    if status != 200 {
        let after = retry_after(&resp);
        let text = resp.text().await.unwrap_or_default();
        let said = refusal_text(&text);
        return Err(match status {
            429 | 503 => Failure::Retry {
                error: err(
                    503,
                    format!("'{id}' is overloaded: it answered {status} ({said})."),
                ),
                after,
            },
            502 | 504 => Failure::Retry {
                error: err(502, format!("'{id}' answered {status} ({said}).")),
                after,
            },
            400 | 404 | 413 | 422 => Failure::Final {
                error: err(
                    400,
                    format!("'{id}' refused the request ({status}): {said}"),
                ),
                upstream_fault: false,
            },
            _ => Failure::Final {
                error: err(502, format!("'{id}' answered {status} ({said}).")),
                upstream_fault: true,
            },
        });
    }
    Ok(resp)
}

/// Reads a 200 answer's stream to its end, relaying it.
async fn read(
    sh: &Shared,
    resp: reqwest::Response,
    relay: &mut Relay<'_>,
) -> Result<Completion, Failure> {
    let (_, first, _) = sh.config.timeouts();
    let id = &sh.id;
    let mut stream = resp.bytes_stream();
    let mut sse = SseDecoder::new();
    let mut state = match sh.config.protocol {
        Protocol::Openai => Stream::Openai(OpenaiStream::default()),
        Protocol::Anthropic => Stream::Anthropic(anthropic::StreamState::default()),
    };
    loop {
        let wait = if relay.ttft.is_none() {
            first
        } else {
            Duration::from_secs(3600)
        };
        let bytes = match tokio::time::timeout(wait, stream.next()).await {
            Err(_) => {
                let e = err(
                    504,
                    format!("'{id}' sent no token within the first-token timeout of {first:?}."),
                );
                return Err(Failure::Retry {
                    error: e,
                    after: None,
                });
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                let e = err(
                    502,
                    format!("'{id}' broke off its answer: {}.", without_url(&e)),
                );
                return Err(broken(e, relay.sent));
            }
            Ok(Some(Ok(b))) => b,
        };
        for ev in sse.feed(&bytes) {
            match ev {
                SseEvent::Done => return state.finish(id, relay),
                SseEvent::Data(d) => state.data(id, &d, relay)?,
            }
        }
    }
    if let Some(SseEvent::Data(d)) = sse.finish() {
        state.data(id, &d, relay)?;
    }
    state.finish(id, relay)
}

/// An answer the upstream broke off: worth another try while nothing reached the client.
fn broken(error: GenerationError, sent: bool) -> Failure {
    match sent {
        false => Failure::Retry { error, after: None },
        true => Failure::Final {
            error,
            upstream_fault: true,
        },
    }
}

enum Stream {
    Openai(OpenaiStream),
    Anthropic(anthropic::StreamState),
}

impl Stream {
    fn data(&mut self, id: &str, d: &str, relay: &mut Relay<'_>) -> Result<(), Failure> {
        let r = match self {
            Stream::Openai(s) => s.data(d, relay),
            Stream::Anthropic(s) => s.data(d, relay),
        };
        r.map_err(|m| Failure::Final {
            error: err(502, format!("'{id}' sent a malformed answer: {m}.")),
            upstream_fault: true,
        })
    }

    fn finish(&mut self, id: &str, relay: &mut Relay<'_>) -> Result<Completion, Failure> {
        let r = match self {
            Stream::Openai(s) => s.finish(relay),
            Stream::Anthropic(s) => s.finish(relay),
        };
        r.map_err(|m| {
            let e = err(502, format!("'{id}' {m}."));
            broken(e, relay.sent)
        })
    }
}

/// Readiness: a real 1-token answer from every URL whose breaker lets a call through, within
/// the first-token timeout; an open breaker fails it.
pub(crate) async fn probe(sh: &Arc<Shared>) -> Result<(), String> {
    let id = &sh.id;
    // the upstream is down when no replica can take work: one replica's open breaker only takes
    // that replica out (the pool skips it), so readiness does not fail for it
    if sh.pool.replicas.iter().all(|r| r.breaker.is_open()) {
        let urls: Vec<&str> = sh.pool.replicas.iter().map(|r| r.url.as_str()).collect();
        return Err(format!(
            "the circuit breaker of every URL of '{id}' is open after repeated failures ({})",
            urls.join(", ")
        ));
    }
    let messages = json!([{"role": "user", "content": "ready"}]);
    let mut body = Map::new();
    body.insert("messages".into(), messages);
    body.insert("max_tokens".into(), json!(1));
    let cost = discover::bound(["ready"].into_iter()) + 1;
    let (_, first, _) = sh.config.timeouts();
    // the probe takes its room like any request, so it never pushes an upstream past its slots;
    // an upstream with no room for it is busy answering abserve's own requests
    let wait = first.min(Duration::from_secs(5));
    let reservations =
        match tokio::time::timeout(wait, sh.pool.take(&[cost], None, Class::Interactive)).await {
            Err(_) if sh.running.load(Ordering::SeqCst) > 0 => return Ok(()),
            Err(_) => return Err(format!("no room at '{id}' for a probe within {wait:?}")),
            Ok(Err(_)) => return Err("every URL's circuit breaker is open".into()),
            Ok(Ok(r)) => r,
        };
    let replica = &sh.pool.replicas[reservations[0].replica];
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut relay = Relay::new(&tx, Instant::now());
    let r = one_try(sh, &replica.url, &body, &mut relay).await;
    drop(reservations);
    rx.close();
    let url = &replica.url;
    match r {
        Ok(_) => {
            replica.breaker.succeeded();
            Ok(())
        }
        Err(Failure::Retry { error, .. }) | Err(Failure::Final { error, .. }) => {
            replica.breaker.failed(Instant::now());
            Err(format!("{url}: {error}"))
        }
        Err(Failure::Cancelled) => Err("cancelled".into()),
    }
}
