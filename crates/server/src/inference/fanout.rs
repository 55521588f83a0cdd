//! `POST /v1/experiments/{name}/fanout`: every variant of an experiment on one input, side by
//! side — each prepared by the model its variant names, admitted as one group per model (all
//! of its variants or none), answered with counts, timings and cost. Variants that cost money
//! can answer a share of the inputs (`fanout_rate`: the others are `skipped`) and be refused
//! past a daily spend cap (`daily_spend_cap`: held before the answer, settled after it;
//! `experiments::spend`). An input the experiment's `samples` select (by the input's hash) is
//! kept as one sample per answering variant, all under one `input_id`.

use std::sync::Arc;

use abserve_ab::{Asked, Experiment, Prompt};
use abserve_engine::prepare::{Input, Options};
use abserve_engine::tools::ToolUse;
use abserve_engine::{ChatMessage, Class, Placement};
use abserve_models::Prepared;
use abserve_protocol::abserve::{Fanout, FanoutResult};
use abserve_protocol::{Sampling, Structure};
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::admission::{admit_group, Admitted, GroupOf};
use super::body_rules::placement_of;
use crate::error::ApiError;
use crate::state::AppState;

/// `{input}`: the user message every variant answers; `service_tier` and `priority` as in a
/// chat request (default: the `fanout` class).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct FanoutBody {
    input: String,
    #[serde(default)]
    service_tier: Option<String>,
    #[serde(default)]
    priority: Option<i64>,
}

/// Every variant of an experiment on one input, concurrently, side by side (queued as one group
/// per model: all of its variants or none). A variant with a `fanout_rate` answers only the
/// inputs its hash samples (`skipped` on the others); one with a `daily_spend_cap` is refused
/// (its `error`) when this answer could pass the cap, and what it cost is added to the day's.
#[utoipa::path(post, path = "/v1/experiments/{name}/fanout", params(("name" = String, Path, description = "the experiment's name")), request_body = FanoutBody, responses((status = 200, body = Fanout)))]
pub async fn fanout(
    State(state): State<Arc<AppState>>,
    UrlPath(name): UrlPath<String>,
    caller: Option<axum::Extension<crate::keys::Caller>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let e = state.experiments.find(&name)?;
    let exp = e.clone();
    let key_class = caller.and_then(|c| c.0.class);
    let Planned {
        input,
        requests,
        asked,
        placement: (class, priority),
    } = state
        .off_thread(move |st| fanout_requests(st, &exp, &body, key_class))
        .await?;
    let mut results = blank_results(&state, &e, &requests);
    let ab = state.experiments.ab()?;
    let (holds, running) = hold_spend(&state, ab, &e, requests, &mut results).await;
    let tools: Vec<Option<ToolUse>> = running.iter().map(|(_, _, p)| p.tools.clone()).collect();
    let positions: Vec<usize> = running.iter().map(|(k, _, _)| *k).collect();
    let at = Placement {
        group: Some(e.name.clone()),
        kv_share: e.max_kv_share,
        class,
        priority,
    };
    let seqs = running.into_iter().map(|(_, m, p)| (m, p)).collect();
    let admitted = admit_by_model(&state, seqs, at).await?;
    let known: Vec<Option<u64>> = admitted.iter().map(|a| a.order).collect();
    let outs =
        futures::future::join_all(admitted.into_iter().map(|a| abserve_engine::collect(a.rx)))
            .await;
    // the order read at admission, else the one collect saw in the stream
    let orders: Vec<u64> = known
        .iter()
        .zip(&outs)
        .map(|(k, o)| {
            k.or_else(|| o.as_ref().ok().and_then(|o| o.admission_order))
                .unwrap_or(u64::MAX)
        })
        .collect();
    for ((&k, o), t) in positions.iter().zip(outs).zip(&tools) {
        let model = std::mem::take(&mut results[k].model);
        results[k] = fanout_result(&state, &e.variants[k].id, o, t.as_ref(), class);
        results[k].model = model;
    }
    for (k, held) in holds {
        held.settle(results[k].cost).await;
    }
    let input_id = offer_samples(&state, &e, &input, &asked, &results);
    // admission rank of each variant that ran (0 = admitted first)
    let mut idx: Vec<usize> = (0..orders.len()).collect();
    idx.sort_by_key(|&i| orders[i]);
    for (rank, &i) in idx.iter().enumerate() {
        results[positions[i]].admission_rank = rank;
    }
    Ok(Json(Fanout {
        experiment: e.name,
        input,
        results,
        input_id,
    })
    .into_response())
}

/// One result per variant, its model named; the variants `fanout_requests` left out (their
/// `fanout_rate` sampled this input out) marked `skipped`.
fn blank_results(
    state: &AppState,
    e: &Experiment,
    requests: &[(usize, usize, Prepared)],
) -> Vec<FanoutResult> {
    let mut results: Vec<FanoutResult> = e
        .variants
        .iter()
        .map(|v| FanoutResult {
            variant: v.id.clone(),
            model: v
                .model
                .clone()
                .unwrap_or_else(|| state.models.default_entry().id.clone()),
            ..Default::default()
        })
        .collect();
    // the variants fanout_requests left out: their fanout_rate sampled this input out
    for (k, v) in e.variants.iter().enumerate() {
        if !requests.iter().any(|(j, _, _)| *j == k) {
            let rate = v.fanout_rate.unwrap_or(1.0);
            results[k].skipped = Some(format!("fanout_rate {rate} left this input out"));
        }
    }
    results
}

/// The capped variants' holds on their daily spend (`experiments::spend`), by variant, and the
/// requests that may run; a variant refused for its cap gets its result's `error`.
async fn hold_spend<'a>(
    state: &AppState,
    ab: &'a crate::experiments::AbState,
    e: &Experiment,
    requests: Vec<(usize, usize, Prepared)>,
    results: &mut [FanoutResult],
) -> (
    Vec<(usize, crate::experiments::Held<'a>)>,
    Vec<(usize, usize, Prepared)>,
) {
    let mut holds = vec![];
    let mut running = vec![];
    for (k, model, p) in requests {
        let most = state.models.at(model).max_cost(&p);
        match ab.hold_spend(&e.name, &e.variants[k], most).await {
            Ok(held) => {
                holds.extend(held.map(|h| (k, h)));
                running.push((k, model, p));
            }
            Err(why) => results[k].error = Some(why),
        }
    }
    (holds, running)
}

/// Admits a fan-out's requests, each on its variant's model: one group per model (all of its
/// variants enter that model's queue, or none do). Variants on several models are admitted
/// model by model; when one model refuses, the receivers already admitted are dropped, which
/// cancels them. The answers come back in the requests' order.
async fn admit_by_model(
    state: &AppState,
    requests: Vec<(usize, Prepared)>,
    at: Placement,
) -> Result<Vec<Admitted>, ApiError> {
    let n = requests.len();
    let mut by_model: std::collections::BTreeMap<usize, Vec<(usize, Prepared)>> =
        Default::default();
    for (pos, (model, r)) in requests.into_iter().enumerate() {
        by_model.entry(model).or_default().push((pos, r));
    }
    let mut slots: Vec<Option<Admitted>> = (0..n).map(|_| None).collect();
    for (model, members) in by_model {
        let (positions, seqs): (Vec<usize>, Vec<Prepared>) = members.into_iter().unzip();
        let admitted = admit_group(state, model, seqs, at.clone(), GroupOf::Variants).await?;
        for (pos, a) in positions.into_iter().zip(admitted) {
            slots[pos] = Some(a);
        }
    }
    Ok(slots.into_iter().flatten().collect())
}

/// A fan-out as it will run (`fanout_requests`).
struct Planned {
    input: String,
    /// (variant's position, its model's in the registry, its sequence)
    requests: Vec<(usize, usize, Prepared)>,
    /// What each variant is asked (`abserve_ab::asked_json` with the `input`), when the
    /// experiment samples this input; empty otherwise.
    asked: Vec<(usize, serde_json::Value)>,
    /// The fan-out's class and `priority`.
    placement: (Class, i32),
}

/// The sequence of every variant of `exp` that answers the fan-out body's input (its
/// `fanout_rate`), prepared by the variant's model as a chat request routed to that variant
/// would be (an unset `max_tokens` is clamped to the room the context leaves), beside the
/// variant's position and its model's in the registry; what each is asked when the input is
/// sampled; and the fan-out's class and `priority` (its `service_tier`, else its key's class,
/// else `fanout`).
fn fanout_requests(
    st: &AppState,
    exp: &Experiment,
    body: &[u8],
    key_class: Option<Class>,
) -> Result<Planned, ApiError> {
    let b: FanoutBody = crate::body::parse_body(body)?;
    let sampled = exp
        .samples
        .as_ref()
        .is_some_and(|r| r.sampled(exp.seed(), &b.input));
    // its own service_tier, else its key's class, else fan-out's
    let default = key_class.unwrap_or(Class::Fanout);
    let class = placement_of(b.service_tier.as_deref(), b.priority, default)?;
    let defaults = Sampling {
        temperature: Some(1.0),
        ..Default::default()
    };
    let (mut requests, mut asked_all) = (vec![], vec![]);
    for (k, v) in exp.variants.iter().enumerate() {
        if !v.fans_out(exp.seed(), &b.input) {
            continue;
        }
        let asked = Asked {
            prompt: Prompt::Chat(vec![ChatMessage::new("user", &b.input)]),
            sampling: defaults.clone(),
            structure: Structure::default(),
        };
        let asked = v
            .apply(asked)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let Prompt::Chat(msgs) = &asked.prompt else {
            return Err(ApiError::internal(
                "a variant turned a conversation into text",
            ));
        };
        let model = st.experiments.variant_model(v)?;
        if sampled {
            let mut j = abserve_ab::asked_json(&asked, &st.models.at(model).id);
            j["input"] = serde_json::Value::String(b.input.clone());
            asked_all.push((k, j));
        }
        let p = st.models.at(model).prepare(
            Input::Chat(msgs),
            &asked.sampling,
            &asked.structure,
            &Options::new(256),
            st.config.max_prompt_tokens,
        )?;
        requests.push((k, model, p));
    }
    Ok(Planned {
        input: b.input,
        requests,
        asked: asked_all,
        placement: class,
    })
}

/// Queues every answering variant's sample of a fan-out input the experiment samples (by the
/// input's hash), all under one input id, which is answered.
fn offer_samples(
    state: &AppState,
    e: &Experiment,
    input: &str,
    asked: &[(usize, serde_json::Value)],
    results: &[FanoutResult],
) -> Option<String> {
    let rules = e.samples.as_ref().filter(|r| r.sampled(e.seed(), input))?;
    let queue = state.experiments.samples.as_ref()?;
    let rules = std::sync::Arc::new(rules.clone());
    let input_id = format!("fanout-{:016x}", rand::random::<u64>());
    for (k, request) in asked {
        let r = &results[*k];
        let calls = r
            .tool_calls
            .as_ref()
            .and_then(|c| serde_json::to_value(c).ok());
        let response = abserve_ab::answer_json(r.output.as_deref().unwrap_or_default(), calls);
        let sample = abserve_ab::Sample {
            id: 0,
            experiment: e.name.clone(),
            variant: r.variant.clone(),
            unit: String::new(),
            request_id: format!("{input_id}-{}", r.variant),
            input_id: Some(input_id.clone()),
            at: 0.0,
            request: request.clone(),
            response,
            finish_reason: r.finish_reason.clone(),
            error: r.error.clone(),
            prompt_tokens: r.prompt_tokens,
            output_tokens: r.completion_tokens,
            latency_ms: r.latency_ms,
            review: None,
        };
        queue.offer(crate::experiments::samples::Pending {
            sample,
            rules: rules.clone(),
        });
    }
    Some(input_id)
}

/// One variant's side of a fan-out: its answer with counts and timings, or its error.
fn fanout_result(
    state: &AppState,
    variant: &str,
    o: Result<abserve_engine::Output, abserve_engine::GenerationError>,
    tools: Option<&ToolUse>,
    class: Class,
) -> FanoutResult {
    let mut r = FanoutResult {
        variant: variant.to_string(),
        ..Default::default()
    };
    match o {
        Ok(o) => {
            let d = &o.completion;
            super::respond::observe(state, class, d);
            r.output = Some(o.text);
            r.prompt_tokens = Some(d.prompt_tokens as u64);
            r.completion_tokens = Some(d.completion_tokens as u64);
            r.shared_prompt_tokens = Some(d.shared_prompt_tokens as u64);
            r.ttft_ms = Some(d.time_to_first_token.as_secs_f64() * 1e3);
            r.latency_ms = Some(d.total_time.as_secs_f64() * 1e3);
            r.finish_reason = Some(d.finish_reason.as_str().into());
            r.cost = d.cost;
            r.grammar_complete = d.grammar.map(|g| g.complete);
            if let Some(t) = tools {
                let text = r.output.take().unwrap_or_default();
                let (m, finish) = super::tool_calls::message(t, &text, d.finish_reason.as_str());
                r.output = m.content;
                r.tool_calls = m.tool_calls;
                r.finish_reason = Some(finish);
            }
        }
        Err(err) => {
            state.metrics.generation_error(&err);
            r.error = Some(err.to_string());
        }
    }
    r
}
