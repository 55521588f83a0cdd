//! How sequences end without an answer: every one at shutdown ([`Scheduler::abort_all`]), every
//! one after a panic escaped a step (`fail_all`, the context untouched), or one alone when the
//! scheduler meets a state it must never reach (`fault`: failed with the state named, counted).

use std::sync::atomic::Ordering;

use super::seq::Seq;
use super::{Compute, Scheduler};
use crate::request::{Event, GenerationError};

impl Scheduler {
    /// Drops everything (engine shutdown): waiting and running get an error event.
    pub fn abort_all<C: Compute>(&mut self, be: &mut C) {
        for s in std::mem::take(&mut self.waiting) {
            let s = s.ended();
            let _ = s.tx.send(Event::Error(GenerationError::ShuttingDown));
        }
        while let Some(a) = self.running.pop() {
            let s = self.release(be, a).ended();
            let _ = s.tx.send(Event::Error(GenerationError::ShuttingDown));
        }
        while self.evict_lru(be, None) {}
        self.publish();
    }

    /// After a panic escaped a step: every waiting and running request gets `cause` as an
    /// internal error; the context is not touched (its state is unknown).
    pub fn fail_all(&mut self, cause: &str) {
        let waiting = std::mem::take(&mut self.waiting);
        let running = std::mem::take(&mut self.running);
        let seqs = waiting
            .into_iter()
            .chain(running.into_iter().map(|a| a.seq));
        for s in seqs {
            let s = s.ended();
            let _ =
                s.tx.send(Event::Error(GenerationError::Internal(cause.into())));
        }
        self.stats.faults.fetch_add(1, Ordering::Relaxed);
        self.publish();
    }

    /// A request that hit a state the scheduler must never reach fails alone, with the state
    /// named; the fault is counted (`abserve_engine_faults_total`) and logged.
    pub(super) fn fault(&mut self, s: Seq, state: String) {
        tracing::error!("engine fault, request failed: {state}");
        self.stats.faults.fetch_add(1, Ordering::Relaxed);
        let s = s.ended();
        let _ = s.tx.send(Event::Error(GenerationError::Internal(state)));
    }
}
