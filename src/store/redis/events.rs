//! What the store did in the background, for `/metrics`: the breaker's
//! confirming PINGs, the cancellations of calls left without an answer and
//! the releases owed to Redis while it was down. All happen after the
//! request that caused them was answered, so without these counters an
//! operator (or a test) cannot tell when they are over.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters kept by one store (its per-second pool keeps its own).
#[derive(Debug, Default)]
pub(super) struct Events {
    checks_answered: AtomicU64,
    checks_failed: AtomicU64,
    cancels_pending: AtomicU64,
    cancels_delivered: AtomicU64,
    cancels_abandoned: AtomicU64,
    owed_pending: AtomicU64,
    owed_sent: AtomicU64,
    owed_lapsed: AtomicU64,
    owed_dropped: AtomicU64,
}

/// The store's background work, read at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RedisEvents {
    /// Confirming PINGs (after `--redis-breaker` failures in a row) that
    /// Redis answered: the circuit stayed closed. Many of these say the
    /// timeout is too tight for the load, not that Redis is down.
    pub checks_answered: u64,
    /// Confirming PINGs that failed too: the circuit opened.
    pub checks_failed: u64,
    /// Cancellations of calls with no answer, still being sent.
    pub cancels_pending: u64,
    /// Cancellations Redis ran: those calls spent nothing.
    pub cancels_delivered: u64,
    /// Cancellations given up (Redis unreachable for a minute, or it
    /// refused them): what those calls committed, if they ran, stays spent.
    pub cancels_abandoned: u64,
    /// Releases Redis could not take (it was down), kept to be sent when
    /// it answers again.
    pub owed_pending: u64,
    /// Owed releases sent once Redis answered.
    pub owed_sent: u64,
    /// Owed releases that no longer mattered when Redis answered (the slot
    /// or the reservation had lapsed), not sent.
    pub owed_lapsed: u64,
    /// Releases not kept (`--redis-max-owed-bytes` were kept already), or
    /// settlements whose sending failed after they may have run.
    pub owed_dropped: u64,
}

impl std::ops::Add for RedisEvents {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            checks_answered: self.checks_answered + other.checks_answered,
            checks_failed: self.checks_failed + other.checks_failed,
            cancels_pending: self.cancels_pending + other.cancels_pending,
            cancels_delivered: self.cancels_delivered + other.cancels_delivered,
            cancels_abandoned: self.cancels_abandoned + other.cancels_abandoned,
            owed_pending: self.owed_pending + other.owed_pending,
            owed_sent: self.owed_sent + other.owed_sent,
            owed_lapsed: self.owed_lapsed + other.owed_lapsed,
            owed_dropped: self.owed_dropped + other.owed_dropped,
        }
    }
}

/// What became of a release owed to Redis (see owed.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owing {
    Sent,
    Lapsed,
    Dropped,
}

/// How a cancellation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CancelEnd {
    Delivered,
    Abandoned,
}

impl Events {
    /// A confirming PING: answered (the circuit stays closed) or not.
    pub(super) fn checked(&self, answered: bool) {
        let counter = if answered {
            &self.checks_answered
        } else {
            &self.checks_failed
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A cancellation starts (pending from now, before its task first
    /// runs); it ends when the returned guard says how. A guard dropped
    /// without a word, as by a runtime shutting down, counts as abandoned.
    pub(super) fn cancelling(self: &Arc<Self>) -> Cancelling {
        self.cancels_pending.fetch_add(1, Ordering::Relaxed);
        Cancelling {
            events: self.clone(),
            end: CancelEnd::Abandoned,
        }
    }

    /// A release owed to Redis was sent, lapsed or dropped.
    pub(super) fn owing(&self, what: Owing) {
        let counter = match what {
            Owing::Sent => &self.owed_sent,
            Owing::Lapsed => &self.owed_lapsed,
            Owing::Dropped => &self.owed_dropped,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// How many releases are owed now.
    pub(super) fn owed(&self, pending: usize) {
        self.owed_pending.store(pending as u64, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> RedisEvents {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RedisEvents {
            checks_answered: load(&self.checks_answered),
            checks_failed: load(&self.checks_failed),
            cancels_pending: load(&self.cancels_pending),
            cancels_delivered: load(&self.cancels_delivered),
            cancels_abandoned: load(&self.cancels_abandoned),
            owed_pending: load(&self.owed_pending),
            owed_sent: load(&self.owed_sent),
            owed_lapsed: load(&self.owed_lapsed),
            owed_dropped: load(&self.owed_dropped),
        }
    }
}

/// One cancellation in progress (see [`Events::cancelling`]).
pub(super) struct Cancelling {
    events: Arc<Events>,
    end: CancelEnd,
}

impl Cancelling {
    /// How it ended.
    pub(super) fn ended(mut self, end: CancelEnd) {
        self.end = end;
    }
}

impl Drop for Cancelling {
    fn drop(&mut self) {
        let counter = match self.end {
            CancelEnd::Delivered => &self.events.cancels_delivered,
            CancelEnd::Abandoned => &self.events.cancels_abandoned,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.events.cancels_pending.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancellation_is_pending_until_it_ends_and_counted_by_how() {
        let events = Arc::new(Events::default());
        let first = events.cancelling();
        let second = events.cancelling();
        assert_eq!(events.snapshot().cancels_pending, 2);
        first.ended(CancelEnd::Delivered);
        drop(second);
        let seen = events.snapshot();
        assert_eq!(
            (
                seen.cancels_pending,
                seen.cancels_delivered,
                seen.cancels_abandoned
            ),
            (0, 1, 1)
        );
        events.checked(true);
        events.checked(false);
        events.checked(true);
        let seen = events.snapshot();
        assert_eq!((seen.checks_answered, seen.checks_failed), (2, 1));
    }
}
