//! The blocking pool's share for request preparation: parsing a body of up to the body limit,
//! rendering templates, tokenizing, compiling grammars run there, a bounded number at once
//! (half the cores, at least one). A client with a huge body or a thousand messages waits for a
//! slot; the async threads that answer `/health` and stream tokens never run this work. Both
//! rooms of the server (inference, experiments) share one.

use tokio::sync::Semaphore;

use crate::error::ApiError;

pub struct Prep(Semaphore);

impl Prep {
    pub fn new() -> Prep {
        let slots = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1));
        Prep(Semaphore::new(slots))
    }

    /// Runs `f` on the blocking pool once a slot is free.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let _slot = self
            .0
            .acquire()
            .await
            .map_err(|_| ApiError::unavailable("The server is shutting down."))?;
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
    }
}
