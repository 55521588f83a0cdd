//! The engine's token-level seam ([`EngineApi`]): what a [`crate::Local`] entry needs of an
//! engine of this process. [`abserve_engine::Engine`] implements it for real; the server's
//! routes are tested without a model through a fake that implements it (as TGI's router tests
//! its queue without a backend). Preparing a request needs only the model's template and
//! vocabulary: the engine's [`Tokenizer`], which this extends.

use std::sync::Arc;

use abserve_engine::device::Device;
use abserve_engine::plan::MemoryPlan;
use abserve_engine::prepare::Tokenizer;
use abserve_engine::{Engine, Event, Request, StatsSnapshot, SubmitError};
use tokio::sync::mpsc::UnboundedReceiver;

pub trait EngineApi: Tokenizer + Send + Sync + 'static {
    /// The memory plan the engine runs under (context, cells, budget).
    fn plan(&self) -> &MemoryPlan;
    /// Requests that may wait before `submit` refuses with `QueueFull`.
    fn max_queue(&self) -> usize;
    fn stats(&self) -> StatsSnapshot;
    /// The engine thread still runs.
    fn is_alive(&self) -> bool;
    /// Why the engine thread died, once it has (a caught panic).
    fn failure(&self) -> Option<String> {
        None
    }
    /// Queues a request; its events arrive on the receiver, the first being `Admitted`.
    /// Dropping the receiver cancels it.
    fn submit(&self, req: Request) -> Result<UnboundedReceiver<Event>, SubmitError>;
    /// Queues requests as one group: all of them or none (see `Engine::submit_group`).
    fn submit_group(
        &self,
        reqs: Vec<Request>,
    ) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError>;
    /// The bytes a token stands for (may be part of a UTF-8 character).
    fn piece(&self, token: i32) -> Vec<u8>;
    /// A token's text, lossily decoded.
    fn token_text(&self, token: i32) -> String;
    /// The device the model's layers are offloaded to, if any.
    fn device(&self) -> Option<Arc<dyn Device>> {
        None
    }
    /// The model file it runs, for people.
    fn origin(&self) -> String {
        "an engine of this process".into()
    }
}

impl EngineApi for Engine {
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
    fn failure(&self) -> Option<String> {
        Engine::failure(self)
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
    fn device(&self) -> Option<Arc<dyn Device>> {
        Engine::device(self)
    }
    fn piece(&self, token: i32) -> Vec<u8> {
        self.model().piece(token)
    }
    fn token_text(&self, token: i32) -> String {
        self.model().token_text(token)
    }
    fn origin(&self) -> String {
        self.model_path().display().to_string()
    }
}

/// One engine shared with other parts of the process (`abserve worker` runs jobs on the engine
/// it also probes for `/ready`).
impl<B: EngineApi + ?Sized> EngineApi for Arc<B> {
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
    fn failure(&self) -> Option<String> {
        (**self).failure()
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
    fn piece(&self, token: i32) -> Vec<u8> {
        (**self).piece(token)
    }
    fn token_text(&self, token: i32) -> String {
        (**self).token_text(token)
    }
    fn device(&self) -> Option<Arc<dyn Device>> {
        (**self).device()
    }
    fn origin(&self) -> String {
        (**self).origin()
    }
}
