//! The interface between the two rooms: a request for `experiment:NAME` is routed to a variant
//! ([`ControlPlane::route`]: by its unit's hash, sticky for a bandit, the control for a stopped
//! variant's bucket or a unit outside the experiment; `X-Abserve-Variant` forces one), and its
//! outcome is recorded as an exposure ([`ControlPlane::record`], committed before the answer
//! goes out) and, for a sampled unit, queued as a sample (`samples`).

use std::sync::Arc;

use abserve_ab::{Experiment, SampleRules, Status};
use abserve_engine::Class;
use abserve_engine::Completion;
use abserve_statistics::assign;

use super::ControlPlane;
use crate::error::ApiError;

/// What a routed request turned into.
#[derive(Debug, Clone)]
pub struct Routed {
    pub experiment: String,
    pub variant: String,
    pub unit: Option<String>,
    pub forced: bool,
    /// An exposure is recorded (the unit is in a running experiment and not forced... or forced, flagged).
    pub record: bool,
    pub kv_share: Option<f64>,
    /// The experiment's own class (`service_tier`): what its requests run in unless the request
    /// or its key says otherwise (`inference::api::classify`; the class a request runs in is
    /// its `ValidRequest::class`, recorded in its exposure).
    pub tier: Option<Class>,
    /// The answer's id (set by the inference API), recorded in its exposure and sample.
    pub request_id: String,
    /// The name of the key whose request it is (set by the inference API), recorded in its
    /// exposure: an inference key posts events only for its own units (`routes::events`).
    pub caller: Option<Arc<str>>,
    /// Its experiment's sampling rules when this unit's conversations are sampled.
    pub sampled: Option<Arc<SampleRules>>,
    /// What a sampled request asked (`abserve_ab::asked_json`; set by the inference API).
    pub asked: Option<serde_json::Value>,
}

/// What a routed request was answered (its first choice), for its sample.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    pub text: String,
    /// Tool calls parsed from it, as OpenAI's `tool_calls`.
    pub tool_calls: Option<serde_json::Value>,
}

impl ControlPlane {
    /// Routes a request for `experiment:<name>`: `unit` reads the request's unit for the experiment
    /// (by its `hash_attribute`); `forced` is the variant `X-Abserve-Variant` asks for.
    pub fn route(
        &self,
        name: &str,
        unit: impl FnOnce(&Experiment) -> Option<String>,
        forced: Option<String>,
    ) -> Result<(Experiment, usize, Routed), ApiError> {
        let e = self
            .find(name)
            .map_err(|_| ApiError::model_not_found(&format!("experiment:{name}")))?;
        let unit = unit(&e);
        let control = e.control_index();
        let sampled_rules = sampled(&e, unit.as_deref());
        if let Some(f) = forced {
            let i = e.variants.iter().position(|v| v.id == f).ok_or_else(|| {
                ApiError::invalid_param(
                    "X-Abserve-Variant",
                    format!("experiment '{name}' has no variant '{f}'"),
                )
            })?;
            let routed = Routed {
                experiment: e.name.clone(),
                variant: f,
                unit,
                forced: true,
                record: true,
                kv_share: e.max_kv_share,
                tier: e.service_tier,
                request_id: String::new(),
                caller: None,
                sampled: sampled_rules,
                asked: None,
            };
            return Ok((e, i, routed));
        }
        let assigned = match (&unit, e.status) {
            (Some(u), Status::Running) => assign(
                e.seed(),
                u,
                e.variants.len(),
                e.coverage,
                &e.weights(),
                e.hash_version,
            ),
            _ => None,
        };
        let assigned = keep_bandit_unit(self, &e, unit.as_deref(), assigned);
        // a variant stopped by a guardrail takes no units: its bucket is served the control and
        // recorded no more (periodic.rs)
        let stopped = assigned.is_some_and(|i| e.variants[i].stopped.is_some());
        let i = assigned.filter(|_| !stopped).unwrap_or(control);
        let routed = Routed {
            experiment: e.name.clone(),
            variant: e.variants[i].id.clone(),
            unit,
            forced: false,
            record: assigned.is_some() && !stopped,
            kv_share: e.max_kv_share,
            tier: e.service_tier,
            request_id: String::new(),
            caller: None,
            // a unit outside the experiment (the control served, nothing recorded) is not sampled
            sampled: sampled_rules.filter(|_| assigned.is_some() && !stopped),
            asked: None,
        };
        Ok((e, i, routed))
    }

    /// Records the exposure of a routed request that ran in `class` (committed before the
    /// response goes out).
    pub async fn record(
        &self,
        routed: &Routed,
        class: Class,
        d: Option<&Completion>,
        error: Option<String>,
        answer: Option<Answer>,
    ) -> Result<(), ApiError> {
        let (Some(ab), true) = (self.ab.as_ref(), routed.record) else {
            return Ok(());
        };
        self.offer_sample(routed, d, error.clone(), answer);
        let x = abserve_ab::Exposure {
            variant: routed.variant.clone(),
            unit: routed.unit.clone().unwrap_or_default(),
            forced: routed.forced,
            latency_ms: d.map(|d| d.total_time.as_secs_f64() * 1e3),
            ttft_ms: d.map(|d| d.time_to_first_token.as_secs_f64() * 1e3),
            output_tokens: d.map(|d| d.completion_tokens as u64),
            error,
            constrained: d.is_some_and(|d| d.grammar.is_some()),
            grammar_complete: d.and_then(|d| d.grammar.map(|g| g.complete)),
            prompt_tokens: d.map(|d| d.prompt_tokens as u64),
            cost: d.and_then(|d| d.cost),
            service_tier: Some(class),
            request_id: Some(routed.request_id.clone()).filter(|r| !r.is_empty()),
            caller: routed.caller.as_deref().map(str::to_string),
        };
        let r = ab.record_exposure(routed.experiment.clone(), x).await;
        if let Err(e) = &r {
            tracing::error!(
                "recording an exposure of experiment '{}' failed: {}",
                routed.experiment,
                e.message
            );
            self.metrics.store_error("exposure");
        }
        r
    }
}

/// The experiment's sampling rules when `unit` is sampled.
fn sampled(e: &Experiment, unit: Option<&str>) -> Option<Arc<SampleRules>> {
    let (rules, unit) = (e.samples.as_ref()?, unit?);
    rules
        .sampled(e.seed(), unit)
        .then(|| Arc::new(rules.clone()))
}

impl ControlPlane {
    /// Queues the sample of a sampled routed request (dropped, counted, when the queue is full).
    fn offer_sample(
        &self,
        routed: &Routed,
        d: Option<&Completion>,
        error: Option<String>,
        answer: Option<Answer>,
    ) {
        let (Some(q), Some(rules), Some(asked)) = (&self.samples, &routed.sampled, &routed.asked)
        else {
            return;
        };
        let answer = answer.unwrap_or_default();
        let response = abserve_ab::answer_json(&answer.text, answer.tool_calls);
        let sample = abserve_ab::Sample {
            id: 0,
            experiment: routed.experiment.clone(),
            variant: routed.variant.clone(),
            unit: routed.unit.clone().unwrap_or_default(),
            request_id: routed.request_id.clone(),
            input_id: None,
            at: 0.0,
            request: asked.clone(),
            response,
            finish_reason: d.map(|d| d.finish_reason.as_str().to_string()),
            error,
            prompt_tokens: d.map(|d| d.prompt_tokens as u64),
            output_tokens: d.map(|d| d.completion_tokens as u64),
            latency_ms: d.map(|d| d.total_time.as_secs_f64() * 1e3),
            review: None,
        };
        q.offer(super::samples::Pending {
            sample,
            rules: rules.clone(),
        });
    }
}

/// A bandit's unit keeps the variant it was first given when the weights change (`assigned` is
/// what hashing with today's weights gives); once a winner is named, every unit gets it.
fn keep_bandit_unit(
    cp: &ControlPlane,
    e: &Experiment,
    unit: Option<&str>,
    assigned: Option<usize>,
) -> Option<usize> {
    let (Some(ab), Some(unit), Some(i)) = (cp.ab.as_ref(), unit, assigned) else {
        return assigned;
    };
    let settled = e.bandit_state.as_ref().is_some_and(|s| s.winner.is_some());
    if e.bandit_settings().is_none() || settled {
        return assigned;
    }
    if let Some(v) = ab.sticky(&e.name, unit) {
        if let Some(k) = e.variants.iter().position(|x| x.id == v) {
            return Some(k);
        }
    }
    ab.stick(&e.name, unit, &e.variants[i].id);
    Some(i)
}
