//! A model this process runs: an engine (llama.cpp behind [`abserve_engine::Engine`], or a test's
//! fake through [`EngineApi`]) as a registry entry. Preparation is the engine crate's one stage
//! ([`abserve_engine::prepare`]); running is the engine's group submission; readiness is a
//! 1-token generation through the scheduler's priority lane.

use std::time::Duration;

use abserve_engine::adapters::adapter_set;
use abserve_engine::plan::MemoryPlan;
use abserve_engine::prepare::{
    constraint, fit_context, prepare, sampling_params, shape, text_tokens, Input, Limits, Options,
    PrepareError,
};
use abserve_engine::{
    ChatMessage, Event, Placement, Request, SamplingParams, StatsSnapshot, SubmitError,
};
use abserve_protocol::{Sampling, Structure};
use futures::future::BoxFuture;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine_api::EngineApi;
use crate::registry::{Capacity, Model, Prepared};

/// How long readiness waits for its 1-token generation.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// An engine of this process as a registry entry.
pub struct Local<E>(pub E);

impl<E: EngineApi> Local<E> {
    fn limits(&self, max_prompt_tokens: usize) -> Limits {
        Limits {
            context: self.0.plan().context as usize,
            max_prompt_tokens,
        }
    }
}

impl<E: EngineApi> Model for Local<E> {
    fn owned_by(&self) -> &str {
        "abserve"
    }

    fn origin(&self) -> String {
        self.0.origin()
    }

    fn capacity(&self) -> Capacity {
        let plan = self.0.plan();
        Capacity {
            context: plan.context as usize,
            seq_slots: plan.seq_slots as usize,
            max_queue: self.0.max_queue(),
        }
    }

    fn plan(&self) -> Option<&MemoryPlan> {
        Some(self.0.plan())
    }

    fn stats(&self) -> StatsSnapshot {
        self.0.stats()
    }

    fn alive(&self) -> Result<(), String> {
        if self.0.is_alive() {
            return Ok(());
        }
        let cause = self.0.failure();
        let cause = cause.as_deref().unwrap_or("it stopped without a cause");
        Err(format!("the engine thread died: {cause}"))
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            if !self.0.is_alive() {
                return Err("engine thread has stopped".into());
            }
            let req = Request {
                probe: true,
                ..Request::new(text_tokens(&self.0, "ready"), SamplingParams::greedy(1))
            };
            let rx = self
                .0
                .submit(req)
                .map_err(|e| format!("probe not accepted: {e}"))?;
            match tokio::time::timeout(PROBE_TIMEOUT, abserve_engine::collect(rx)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("probe generation failed: {e}")),
                Err(_) => Err(format!(
                    "probe generation took longer than {} s",
                    PROBE_TIMEOUT.as_secs()
                )),
            }
        })
    }

    fn prepare(
        &self,
        input: Input<'_>,
        sampling: &Sampling,
        structure: &Structure,
        options: &Options,
        max_prompt_tokens: usize,
    ) -> Result<Prepared, PrepareError> {
        let p = prepare(
            &self.0,
            input,
            sampling,
            structure,
            options,
            self.limits(max_prompt_tokens),
        )?;
        let (prompt, tools, logprobs) = (p.prompt.clone(), p.tools.clone(), p.params.logprobs);
        let mut prepared = Prepared::new(p, prompt, tools);
        prepared.logprobs = logprobs;
        Ok(prepared)
    }

    fn check(
        &self,
        sampling: &Sampling,
        structure: &Structure,
        probe: &[ChatMessage],
    ) -> Result<(), PrepareError> {
        let mut params = sampling_params(sampling, &Options::new(16))?;
        if sampling.max_tokens.is_some() {
            // the context rule of every request, for the shortest prompt there is
            fit_context(&[0], &mut params, true, self.limits(usize::MAX), "prompt")?;
        }
        let shaped = shape(&self.0, Some(probe), structure)?;
        constraint(&self.0, shaped.grammar.as_ref())?;
        // the variant's adapters are admitted into the plan now, so that settings that name one
        // that does not fit are refused before their first request
        adapter_set(self.0.adapters(), sampling.adapters.as_deref())?;
        Ok(())
    }

    fn submit(
        &self,
        seqs: Vec<Prepared>,
        at: Placement,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError> {
        let mut reqs = Vec::with_capacity(seqs.len());
        for s in &seqs {
            let Some(p) = s.job::<abserve_engine::prepare::Prepared>() else {
                return Err(SubmitError::Invalid(
                    "model",
                    "the request was prepared for another model".into(),
                ));
            };
            reqs.push(p.clone().take_request(at.clone()));
        }
        match reqs.len() {
            1 => Ok(vec![self.0.submit(reqs.remove(0))?]),
            _ => self.0.submit_group(reqs),
        }
    }

    fn tokens(&self) -> Option<&dyn EngineApi> {
        Some(&self.0)
    }
}
