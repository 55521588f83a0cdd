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

use crate::request::{Event, EventSender, GenerationError, Request};
use crate::scheduler::{Compute, InFlight, Scheduler};

/// What the handle sends the engine thread.
pub(crate) enum Command {
    /// A request with its place among slots + queue, held until it ends.
    Submit(Request, EventSender, InFlight),
    /// Members admitted together (see `Scheduler::enqueue_gang`).
    SubmitGroup(Vec<(Request, EventSender, InFlight)>),
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
            // each permit is dropped before its request hears
            Command::Submit(_, tx, permit) => {
                drop(permit);
                let _ = tx.send(error());
            }
            Command::SubmitGroup(members) => {
                for (_, tx, permit) in members {
                    drop(permit);
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
            Command::Submit(req, tx, permit) => {
                sched.enqueue(req, tx, permit);
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

/// A request the loop was handed, for tests, holding a place counted in `stats` as the
/// handle's would.
#[cfg(test)]
pub(crate) fn submit(
    req: Request,
    stats: &std::sync::Arc<crate::scheduler::EngineStats>,
) -> (Command, crate::request::EventReceiver) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (_, mut permit) = InFlight::take(stats, 1, req.class);
    (Command::Submit(req, tx, permit.remove(0)), rx)
}

#[cfg(test)]
mod tests;
