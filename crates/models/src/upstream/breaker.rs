//! A circuit breaker per upstream URL: closed until `failures` calls in a row fail, then open
//! (nothing is sent) for `cooldown`, then half-open: one call goes through as a probe, and its
//! outcome closes the breaker or opens it for another cooldown.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is allowed; `probing` once it was sent.
    HalfOpen {
        probing: bool,
    },
}

pub struct Breaker {
    state: Mutex<State>,
    failures: u32,
    cooldown: Duration,
}

impl Breaker {
    pub fn new(failures: u32, cooldown: Duration) -> Breaker {
        Breaker {
            state: Mutex::new(State::Closed { failures: 0 }),
            failures,
            cooldown,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a call may be sent now (an open breaker whose cooldown passed lets one probe).
    pub fn admits(&self, now: Instant) -> bool {
        let mut s = self.state();
        if let State::Open { until } = *s {
            if now >= until {
                *s = State::HalfOpen { probing: false };
            }
        }
        match *s {
            State::Closed { .. } => true,
            State::Open { .. } => false,
            State::HalfOpen { probing } => !probing,
        }
    }

    /// A call was sent (a half-open breaker's probe is now out).
    pub fn started(&self, _now: Instant) {
        let mut s = self.state();
        if let State::HalfOpen { probing: false } = *s {
            *s = State::HalfOpen { probing: true };
        }
    }

    pub fn succeeded(&self) {
        *self.state() = State::Closed { failures: 0 };
    }

    /// A call failed for the upstream's sake (unreachable, 5xx, a timeout, a bad answer).
    pub fn failed(&self, now: Instant) {
        let mut s = self.state();
        *s = match *s {
            State::Closed { failures } if failures + 1 < self.failures => State::Closed {
                failures: failures + 1,
            },
            _ => State::Open {
                until: now + self.cooldown,
            },
        };
    }

    /// A call ended without saying anything about the upstream (cancelled by its client): a
    /// half-open breaker may probe again.
    pub fn abandoned(&self) {
        let mut s = self.state();
        if let State::HalfOpen { probing: true } = *s {
            *s = State::HalfOpen { probing: false };
        }
    }

    /// 0 closed, 1 open, 2 half-open (as `/metrics` shows it).
    pub fn gauge(&self) -> u8 {
        match *self.state() {
            State::Closed { .. } => 0,
            State::Open { .. } => 1,
            State::HalfOpen { .. } => 2,
        }
    }

    pub fn is_open(&self) -> bool {
        matches!(*self.state(), State::Open { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_in_a_row_and_half_opens_for_one_probe() {
        let b = Breaker::new(3, Duration::from_secs(10));
        let t = Instant::now();
        b.failed(t);
        b.failed(t);
        b.succeeded();
        b.failed(t);
        b.failed(t);
        assert!(b.admits(t), "a success in between starts the count again");
        b.failed(t);
        assert!(!b.admits(t + Duration::from_secs(9)));
        assert_eq!(b.gauge(), 1);
        let later = t + Duration::from_secs(10);
        assert!(b.admits(later));
        b.started(later);
        assert!(!b.admits(later), "one probe at a time");
        b.failed(later);
        assert!(
            !b.admits(later + Duration::from_secs(5)),
            "a failed probe opens it again"
        );
        let again = later + Duration::from_secs(10);
        assert!(b.admits(again));
        b.started(again);
        b.succeeded();
        assert!(b.admits(again) && b.gauge() == 0);
    }
}
