//! What the server needs of an engine, as one trait: the routes are tested without a model
//! through a fake that implements it (as TGI's router tests its queue without a backend), and
//! [`abserve_engine::Engine`] implements it for real.

use std::sync::Arc;

use abserve_engine::device::Device;
use abserve_engine::plan::MemoryPlan;
use abserve_engine::{
    ChatMessage, ChatTemplateError, Engine, Event, Request, StatsSnapshot, SubmitError,
};
use tokio::sync::mpsc::UnboundedReceiver;

pub trait Backend: Send + Sync + 'static {
    /// The memory plan the engine runs under (context, cells, budget).
    fn plan(&self) -> &MemoryPlan;
    /// Requests that may wait before `submit` refuses with `QueueFull`.
    fn max_queue(&self) -> usize;
    fn stats(&self) -> StatsSnapshot;
    /// The engine thread still runs.
    fn is_alive(&self) -> bool;
    /// Queues a request; its events arrive on the receiver, the first being `Admitted`.
    /// Dropping the receiver cancels it.
    fn submit(&self, req: Request) -> Result<UnboundedReceiver<Event>, SubmitError>;
    /// Queues requests as one group: all of them or none (see `Engine::submit_group`).
    fn submit_group(
        &self,
        reqs: Vec<Request>,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError>;
    /// Token ids of `text`; `add_special` adds BOS (a rendered chat template carries its own).
    fn tokenize(&self, text: &str, add_special: bool) -> Vec<i32>;
    /// The model's chat template applied to `messages`, ending with the assistant's turn.
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, ChatTemplateError>;
    fn n_vocab(&self) -> usize;
    /// The bytes a token stands for (may be part of a UTF-8 character).
    fn piece(&self, token: i32) -> Vec<u8>;
    /// A token's text, lossily decoded.
    fn token_text(&self, token: i32) -> String;
    /// The device the model's layers are offloaded to, if any.
    fn device(&self) -> Option<Arc<dyn Device>> {
        None
    }
}

impl Backend for Engine {
    fn plan(&self) -> &MemoryPlan {
        Engine::plan(self)
    }
    fn max_queue(&self) -> usize {
        Engine::max_queue(self)
    }
    fn stats(&self) -> StatsSnapshot {
        Engine::stats(self)
    }
    fn is_alive(&self) -> bool {
        Engine::is_alive(self)
    }
    fn submit(&self, req: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        Engine::submit(self, req)
    }
    fn submit_group(
        &self,
        reqs: Vec<Request>,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError> {
        Engine::submit_group(self, reqs)
    }
    fn tokenize(&self, text: &str, add_special: bool) -> Vec<i32> {
        self.model().tokenize(text, add_special)
    }
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, ChatTemplateError> {
        Engine::render_chat(self, messages)
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        Engine::device(self)
    }
    fn n_vocab(&self) -> usize {
        self.model().n_vocab()
    }
    fn piece(&self, token: i32) -> Vec<u8> {
        self.model().piece(token)
    }
    fn token_text(&self, token: i32) -> String {
        self.model().token_text(token)
    }
}

/// One engine shared with other parts of the process (`abserve worker` runs jobs on the engine
/// it also probes for `/ready`).
impl<B: Backend + ?Sized> Backend for Arc<B> {
    fn plan(&self) -> &MemoryPlan {
        (**self).plan()
    }
    fn max_queue(&self) -> usize {
        (**self).max_queue()
    }
    fn stats(&self) -> StatsSnapshot {
        (**self).stats()
    }
    fn is_alive(&self) -> bool {
        (**self).is_alive()
    }
    fn submit(&self, req: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        (**self).submit(req)
    }
    fn submit_group(
        &self,
        reqs: Vec<Request>,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError> {
        (**self).submit_group(reqs)
    }
    fn tokenize(&self, text: &str, add_special: bool) -> Vec<i32> {
        (**self).tokenize(text, add_special)
    }
    fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, ChatTemplateError> {
        (**self).render_chat(messages)
    }
    fn n_vocab(&self) -> usize {
        (**self).n_vocab()
    }
    fn piece(&self, token: i32) -> Vec<u8> {
        (**self).piece(token)
    }
    fn token_text(&self, token: i32) -> String {
        (**self).token_text(token)
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        (**self).device()
    }
}
