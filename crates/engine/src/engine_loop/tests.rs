use std::sync::Arc;

use super::*;
use crate::fault::PanicAt;
use crate::sampler::SamplingParams;
use crate::scheduler::{EngineStats, SchedulerConfig, Snapshot};

/// A model that computes nothing; `PanicAt` makes its first decode panic (a bug escaping a
/// step, injected through `Compute`).
struct Idle;

impl Compute for Idle {
    fn batch_capacity(&self) -> usize {
        64
    }
    fn clear_batch(&mut self) {}
    fn add(&mut self, _: i32, _: usize, _: i32, _: bool) {}
    fn decode(&mut self) -> Result<bool, String> {
        Ok(true)
    }
    fn logits(&self, _: usize) -> &[f32] {
        &[]
    }
    fn remove_seq(&mut self, _: i32) {}
    fn share_prefix(&mut self, _: i32, _: i32, _: usize) {}
    fn truncate_seq(&mut self, _: i32, _: usize) {}
    fn save_seq(&mut self, _: i32) -> Option<(Snapshot, usize)> {
        None
    }
    fn restore_seq(&mut self, _: &Snapshot, _: i32) -> bool {
        false
    }
    fn piece(&self, _: i32) -> Vec<u8> {
        vec![]
    }
    fn is_eog(&self, _: i32) -> bool {
        false
    }
    fn set_adapters(&mut self, _: usize, _: &crate::adapters::AdapterSet) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn a_panic_in_a_step_fails_every_request_in_flight_and_is_returned_with_its_cause() {
    let stats = Arc::new(EngineStats::default());
    let mut sched = Scheduler::new(SchedulerConfig::new(256, 4, 128), stats.clone());
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut receivers = vec![];
    for i in 0..3 {
        let (cmd, events) = submit(
            Request::new(vec![5 + i; 4], SamplingParams::greedy(3)),
            &stats,
        );
        tx.send(cmd).unwrap();
        receivers.push(events);
    }
    let mut heard = None;
    let cause = run_guarded(&mut sched, &mut PanicAt::new(Idle, 1), &rx, |c| {
        heard = Some(c.to_string())
    })
    .unwrap_err();
    assert_eq!(
        heard.as_deref(),
        Some(cause.as_str()),
        "the handle heard the cause"
    );
    assert!(cause.contains("injected fault: decode 1"), "{cause}");
    for mut events in receivers {
        let mut last = None;
        while let Ok(e) = events.try_recv() {
            last = Some(e);
        }
        match last {
            Some(Event::Error(GenerationError::Internal(m))) => {
                assert!(m.contains("injected fault"), "{m}")
            }
            other => panic!("expected an internal error, got {other:?}"),
        }
    }
    let s = stats.snapshot();
    assert_eq!(s.inflight, 0, "every request was answered");
    assert_eq!(s.faults, 1);
}
