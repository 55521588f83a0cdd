//! Faults injected on purpose, for tests only: a model that panics at its Nth decode
//! ([`PanicAt`]), so that tests see what a panic on the engine thread does — every request
//! fails with the cause, `/health` fails, `serve` exits non-zero. Compiled into unit tests, and
//! into a binary only with the cargo feature `fault-injection` (which `scripts/test.sh` builds
//! for `crates/cli/tests/engine_fault.rs`); the shipped binary has none of it.

use crate::scheduler::Compute;

/// The environment variable that makes the engine thread panic at its Nth decode (in a binary
/// built with `fault-injection`): the fault the process-level test injects.
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
