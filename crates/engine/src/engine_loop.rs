//! The engine thread's loop: take commands from the handle's channel, step the scheduler,
//! repeat; on shutdown abort what is queued or running.
//!
//! Invariant: the loop never dies silently. A panic that escapes a step (a bug: every
//! impossible state the scheduler can detect is already a typed error failing only the request
//! concerned) is caught here: every queued and running request gets
//! [`GenerationError::Internal`] naming the cause, commands still in the channel are answered
//! the same way, and the cause is returned for the handle ([`crate::Engine::failure`]), so
//! `/health` fails and `serve` exits non-zero with the cause in its log for a supervisor to
//! restart it. The context is not touched after a panic (its state is unknown).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::request::{Event, GenerationError, Request};
use crate::scheduler::{Compute, Scheduler};

/// What the handle sends the engine thread.
pub(crate) enum Command {
    Submit(Request, crate::request::EventSender),
    /// Members admitted together (see `Scheduler::enqueue_gang`).
    SubmitGroup(Vec<(Request, crate::request::EventSender)>),
    Shutdown,
}

/// Runs the loop until shutdown (`Ok`) or a panic (`Err` with its message). After a panic,
/// `died` hears the cause first (the handle then reports the engine dead before any request
/// sees the error), then every request in the engine and in the channel is failed with it.
pub(crate) fn run_guarded<C: Compute>(
    sched: &mut Scheduler,
    be: &mut C,
    rx: &Receiver<Command>,
    died: impl FnOnce(&str),
) -> Result<(), String> {
    let Err(panic) = catch_unwind(AssertUnwindSafe(|| run_loop(sched, be, rx))) else {
        return Ok(());
    };
    let cause = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    let cause = format!("the engine thread panicked: {cause}");
    tracing::error!("{cause}; failing every request in the engine");
    died(&cause);
    sched.fail_all(&cause);
    let error = || Event::Error(GenerationError::Internal(cause.clone()));
    while let Ok(cmd) = rx.try_recv() {
        match cmd {
            Command::Submit(_, tx) => {
                sched.forget_inflight(1);
                let _ = tx.send(error());
            }
            Command::SubmitGroup(members) => {
                sched.forget_inflight(members.len());
                for (_, tx) in members {
                    let _ = tx.send(error());
                }
            }
            Command::Shutdown => {}
        }
    }
    Err(cause)
}

fn run_loop<C: Compute>(sched: &mut Scheduler, be: &mut C, rx: &Receiver<Command>) {
    let handle = |sched: &mut Scheduler, cmd: Command| -> bool {
        match cmd {
            Command::Submit(req, tx) => {
                sched.enqueue(req, tx);
                true
            }
            Command::SubmitGroup(members) => {
                sched.enqueue_gang(members);
                true
            }
            Command::Shutdown => false,
        }
    };
    loop {
        if sched.is_idle() {
            match rx.recv() {
                Ok(cmd) => {
                    if !handle(sched, cmd) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        let mut stop = false;
        while let Ok(cmd) = rx.try_recv() {
            if !handle(sched, cmd) {
                stop = true;
                break;
            }
        }
        if stop {
            break;
        }
        if !sched.step(be) && !sched.is_idle() {
            // nothing runnable yet (e.g. waiting on a shared prefix): wait briefly for input
            match rx.recv_timeout(Duration::from_millis(1)) {
                Ok(cmd) => {
                    if !handle(sched, cmd) {
                        break;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    sched.abort_all(be);
}

/// The environment variable that makes the engine thread panic at its Nth decode: the fault the
/// process-level test injects (`crates/cli/tests/engine_fault.rs`) to see requests fail,
/// `/health` fail and the process exit non-zero with the cause. Not for production use.
pub const PANIC_AT_DECODE: &str = "ABSERVE_TEST_PANIC_AT_DECODE";

/// The decode at which to panic, when [`PANIC_AT_DECODE`] is set.
pub(crate) fn injected_panic() -> Option<u64> {
    let at = std::env::var(PANIC_AT_DECODE).ok()?.parse().ok()?;
    tracing::warn!("{PANIC_AT_DECODE}={at}: the engine thread will panic at decode {at}");
    Some(at)
}

/// A model that panics at its `at`-th decode and is `inner` otherwise (a fault injected through
/// [`Compute`]).
pub(crate) struct PanicAt<C> {
    inner: C,
    at: u64,
    decodes: u64,
}

impl<C> PanicAt<C> {
    pub fn new(inner: C, at: u64) -> Self {
        PanicAt {
            inner,
            at,
            decodes: 0,
        }
    }
}

impl<C: Compute> Compute for PanicAt<C> {
    fn batch_capacity(&self) -> usize {
        self.inner.batch_capacity()
    }
    fn clear_batch(&mut self) {
        self.inner.clear_batch()
    }
    fn add(&mut self, token: i32, pos: usize, seq: i32, logits: bool) {
        self.inner.add(token, pos, seq, logits)
    }
    fn decode(&mut self) -> Result<bool, String> {
        self.decodes += 1;
        if self.decodes == self.at {
            panic!("injected fault: decode {} ({PANIC_AT_DECODE})", self.at);
        }
        self.inner.decode()
    }
    fn logits(&self, batch_index: usize) -> &[f32] {
        self.inner.logits(batch_index)
    }
    fn remove_seq(&mut self, seq: i32) {
        self.inner.remove_seq(seq)
    }
    fn share_prefix(&mut self, src: i32, dst: i32, len: usize) {
        self.inner.share_prefix(src, dst, len)
    }
    fn truncate_seq(&mut self, seq: i32, len: usize) {
        self.inner.truncate_seq(seq, len)
    }
    fn save_seq(&mut self, seq: i32) -> Option<(crate::scheduler::Snapshot, usize)> {
        self.inner.save_seq(seq)
    }
    fn restore_seq(&mut self, snap: &crate::scheduler::Snapshot, seq: i32) -> bool {
        self.inner.restore_seq(snap, seq)
    }
    fn piece(&self, token: i32) -> Vec<u8> {
        self.inner.piece(token)
    }
    fn is_eog(&self, token: i32) -> bool {
        self.inner.is_eog(token)
    }
    fn set_adapters(
        &mut self,
        lane: usize,
        set: &crate::adapters::AdapterSet,
    ) -> Result<(), String> {
        self.inner.set_adapters(lane, set)
    }
}

/// A request the loop was handed, for tests.
#[cfg(test)]
pub(crate) fn submit(req: Request) -> (Command, crate::request::EventReceiver) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    (Command::Submit(req, tx), rx)
}

#[cfg(test)]
mod tests;
