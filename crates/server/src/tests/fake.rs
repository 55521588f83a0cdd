//! A backend without a model: bytes are tokens, the chat template is `role: content` lines,
//! and every request is answered at once from the text `hello world` (as many tokens as
//! `max_tokens` allows), so each route can be checked against exact numbers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use abserve_engine::device::{Device, FakeDevice};
use abserve_engine::gguf::ModelShape;
use abserve_engine::grammar::{Grammars, Vocab};
use abserve_engine::plan::{Budget, KvType, MemoryPlan, Offload, PlanRequest};
use abserve_engine::prepare::Tokenizer;
use abserve_engine::{
    ChatMessage, ChatTemplateError, Completion, Event, FinishReason, GenerationError, Request,
    StatsSnapshot, SubmitError, TokenLogprob,
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use abserve_models::EngineApi;

/// What the fake answers: the bytes of this text, one token each.
pub const ANSWER: &[u8] = b"hello world";
pub const CONTEXT: u64 = 512;
/// The device budget of a fake with a device.
pub const DEVICE_BUDGET: u64 = 64 << 20;

pub struct Fake {
    plan: MemoryPlan,
    ctl: Arc<Control>,
    device: Option<Arc<FakeDevice>>,
    /// Grammars over the byte vocabulary (structured outputs compile; the answer stays canned).
    grammars: Grammars,
}

/// What a test sets and reads while the server owns the fake.
#[derive(Default)]
pub struct Control {
    /// `submit` refuses with `QueueFull`.
    pub queue_full: AtomicBool,
    /// Generations fail with a decode error after their first token.
    pub fail: AtomicBool,
    /// The engine thread "stopped".
    pub dead: AtomicBool,
    /// Why it stopped (a caught panic's cause).
    pub failure: Mutex<Option<String>>,
    /// Generations fail with an internal engine error (an impossible state) at once.
    pub internal: AtomicBool,
    /// Every request submitted, in order.
    pub submitted: Mutex<Vec<Request>>,
}

impl Fake {
    /// With every layer offloaded to `device` (its memory then decides `/ready`).
    pub fn with_device(ctl: Arc<Control>, device: Option<Arc<FakeDevice>>) -> Fake {
        let shape = ModelShape {
            n_layer: 2,
            n_head: 2,
            n_head_kv: 2,
            n_embd: 64,
            head_dim_k: 32,
            head_dim_v: 32,
            n_vocab: 256,
            n_ctx_train: 4096,
        };
        let plan = MemoryPlan::new(&PlanRequest {
            weights_bytes: 1 << 20,
            adapter_bytes: 0,
            shape,
            kv_type: KvType::F16,
            memory_total: 1 << 40,
            budget: Budget::Bytes(1 << 40),
            margin: 0.1,
            context: CONTEXT,
            n_batch: 64,
            max_sequences: 4,
            kv_cells_cap: None,
            flash_attention: false,
            kv_unified: false,
            prefix_store: Some(0),
            lanes: 1,
            draft: None,
            offload: device.as_ref().map(|d| Offload {
                device: d.memory(),
                budget: Budget::Bytes(DEVICE_BUDGET),
                layers: 2,
                weights_bytes: 1 << 20,
            }),
        });
        let grammars =
            Grammars::new(Vocab::bytes(), Default::default()).expect("the byte vocabulary builds");
        Fake {
            plan,
            ctl,
            device,
            grammars,
        }
    }
}

/// Bytes are tokens; the vocabulary asks for no BOS (token 1 would stand for it).
impl Tokenizer for Fake {
    fn tokenize(&self, text: &str) -> Vec<i32> {
        text.bytes().map(|b| b as i32).collect()
    }
    fn render_chat(
        &self,
        messages: &[ChatMessage],
        _tools: &[abserve_protocol::Tool],
    ) -> Result<String, ChatTemplateError> {
        let mut s: String = messages
            .iter()
            .map(|m| format!("{}: {}\n", m.role, m.content))
            .collect();
        s.push_str("assistant:");
        Ok(s)
    }
    fn bos(&self) -> Option<i32> {
        None
    }
    fn n_vocab(&self) -> usize {
        256
    }
    fn grammars(&self) -> Result<&Grammars, String> {
        Ok(&self.grammars)
    }
}

impl EngineApi for Fake {
    fn plan(&self) -> &MemoryPlan {
        &self.plan
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        self.device.clone().map(|d| d as Arc<dyn Device>)
    }
    fn max_queue(&self) -> usize {
        8
    }
    fn stats(&self) -> StatsSnapshot {
        abserve_engine::EngineStats::default().snapshot()
    }
    fn is_alive(&self) -> bool {
        !self.ctl.dead.load(Ordering::SeqCst)
    }
    fn failure(&self) -> Option<String> {
        self.ctl.failure.lock().unwrap().clone()
    }
    fn submit(&self, req: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        if self.ctl.queue_full.load(Ordering::SeqCst) {
            return Err(SubmitError::QueueFull(8));
        }
        let (tx, rx) = unbounded_channel();
        let n = (req.params.max_tokens as usize).min(ANSWER.len());
        let _ = tx.send(Event::Admitted {
            queue_time: Duration::ZERO,
            order: 0,
        });
        if self.ctl.internal.load(Ordering::SeqCst) {
            let state = "running sequence 7, found in this admission, is gone".into();
            let _ = tx.send(Event::Error(GenerationError::Internal(state)));
            return Ok(rx);
        }
        for (i, &b) in ANSWER[..n].iter().enumerate() {
            if i == 1 && self.ctl.fail.load(Ordering::SeqCst) {
                let _ = tx.send(Event::Error(GenerationError::Decode("fake failure".into())));
                self.ctl.submitted.lock().unwrap().push(req);
                return Ok(rx);
            }
            let logprob = req.params.logprobs.map(|k| TokenLogprob {
                token: b as i32,
                logprob: -0.5,
                top: vec![(b as i32, -0.5); k as usize],
            });
            let _ = tx.send(Event::Token {
                token: b as i32,
                text: (b as char).to_string(),
                logprob,
            });
        }
        let finish_reason = if n < ANSWER.len() {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        let _ = tx.send(Event::Done(Completion {
            finish_reason,
            prompt_tokens: req.prompt.len(),
            completion_tokens: n,
            shared_prompt_tokens: 0,
            preemptions: 0,
            queue_time: Duration::ZERO,
            time_to_first_token: Duration::from_millis(3),
            total_time: Duration::from_millis(10),
            tail_text: String::new(),
            grammar: None,
            cost: None,
        }));
        self.ctl.submitted.lock().unwrap().push(req);
        Ok(rx)
    }
    fn submit_group(
        &self,
        reqs: Vec<Request>,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError> {
        // the fake's places: 4 slots + 8 queued
        if reqs.len() > 12 {
            return Err(SubmitError::GroupTooLarge {
                group: reqs.len(),
                capacity: 12,
                slots: 4,
                queue: 8,
            });
        }
        reqs.into_iter().map(|r| self.submit(r)).collect()
    }
    fn piece(&self, token: i32) -> Vec<u8> {
        vec![token as u8]
    }
    fn token_text(&self, token: i32) -> String {
        (token as u8 as char).to_string()
    }
}
