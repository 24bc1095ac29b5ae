//! The circuit breaker: after `breaker_threshold` failures in a row, and a
//! confirming PING that fails too, calls stop (each decision fails at once,
//! and the limiter answers from the failure modes) while Redis is probed in
//! the background until it answers.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use super::RedisStore;
use crate::store::StoreError;

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

impl RedisStore {
    /// Counts a transient failure. At the threshold, Redis is asked a fresh
    /// PING before the circuit opens: calls can time out while Redis is up
    /// (a burst of heavy requests from one client, say), and opening the
    /// circuit then would hand everyone the failure modes. Only a Redis that
    /// also fails the PING is treated as down.
    pub(super) fn failed(&self, error: &StoreError) {
        let breaker = &self.inner.breaker;
        if !breaker.record_failure(self.inner.options.breaker_threshold) {
            return;
        }
        let store = self.clone();
        let error = error.clone();
        tokio::spawn(async move {
            let breaker = &store.inner.breaker;
            let answers = store.probe().await.is_ok();
            breaker.confirmed(!answers);
            store.inner.events.checked(answers);
            if answers {
                tracing::debug!(%error, "Redis calls failed but Redis answers PING; the circuit stays closed");
                return;
            }
            tracing::error!(
                %error,
                "Redis unavailable: answering from failure modes without waiting until it is back"
            );
            let mut attempts = 0u64;
            loop {
                tokio::time::sleep(store.inner.options.probe_interval).await;
                attempts += 1;
                if store.probe().await.is_ok() {
                    // Connections made before the outage may be stuck
                    // reconnecting: each worker makes a new one on next use.
                    breaker.close();
                    tracing::info!(
                        probes = attempts,
                        "Redis is back: deciding through Redis again"
                    );
                    return;
                }
            }
        });
    }
}
