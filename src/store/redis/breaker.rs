//! The circuit breaker: after `breaker_threshold` failures in a row, and a
//! confirming PING that fails too, calls stop (each decision fails at once,
//! and the limiter answers from the failure modes) while Redis is probed in
//! the background until it answers.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

/// One breaker's state.
#[derive(Default)]
pub(super) struct Breaker {
    failures: AtomicU32,
    open: AtomicBool,
    /// A PING is checking whether failing calls mean Redis is down.
    confirming: AtomicBool,
    /// Bumped after an outage so that threads drop their old connections.
    generation: AtomicUsize,
}

impl Breaker {
    /// Whether calls are stopped.
    pub(super) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// A call succeeded: the failures in a row start again from zero.
    pub(super) fn record_ok(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Counts a failure; true when it is the one that should start a
    /// confirming probe (the threshold is reached, the breaker is closed and
    /// no probe runs yet).
    pub(super) fn record_failure(&self, threshold: u32) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        failures >= threshold
            && !self.open.load(Ordering::Acquire)
            && !self.confirming.swap(true, Ordering::AcqRel)
    }

    /// The confirming probe is over: open (it failed) or not.
    pub(super) fn confirmed(&self, open: bool) {
        self.failures.store(0, Ordering::Relaxed);
        if open {
            self.open.store(true, Ordering::Release);
        }
        self.confirming.store(false, Ordering::Release);
    }

    /// The outage is over: connections made before it are dropped on next use.
    pub(super) fn close(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.failures.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }

    /// The connections' generation (see [`Breaker::close`]).
    pub(super) fn generation(&self) -> usize {
        self.generation.load(Ordering::Acquire)
    }

    /// Makes every thread connect afresh on its next call.
    pub(super) fn reconnect(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}
