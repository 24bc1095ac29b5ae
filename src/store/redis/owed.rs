//! What an instance owes Redis: releases (an in-flight cap's, and a
//! budget's settlement that was never sent) that Redis could not take while
//! it was down, kept in the order they came and sent in the background once
//! it answers. Lost, each freed slot would stay held until
//! `max_hold_seconds` and each settled reservation charged until its window
//! ends. A release is the same whether it runs once or twice (the ID is
//! gone); a settlement is not, so only one that was never sent is kept, and
//! one whose sending fails after it may have run is dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::events::{Events, Owing};
use super::options::RedisOptions;
use super::route::Route;
use super::slots::Exact;
use crate::algorithm::{HoldOp, NANOS_PER_TICK};
use crate::clock::Nanos;
use crate::store::{Check, HoldCheck, StoreError};

/// How often the server asks [`OwedReleases::pay`] to send what is owed.
pub const OWED_EVERY: Duration = Duration::from_millis(100);

/// One Redis's owed releases (each pool keeps its own).
pub(super) struct Owed {
    kept: parking_lot::Mutex<Kept>,
    /// How many are kept: read every [`OWED_EVERY`] to skip an empty one
    /// without its lock.
    count: AtomicUsize,
    /// After a pass Redis failed, no other before this time (a probe
    /// interval later).
    retry_at: AtomicU64,
    retry_every: Nanos,
    /// The most bytes kept (`--redis-max-owed-bytes`, each entry counted
    /// with its key and ID); past it the newest are not kept (dropped).
    max_bytes: usize,
    /// Checks sent together.
    per_call: usize,
    events: Arc<Events>,
}

#[derive(Default)]
struct Kept {
    /// Oldest first.
    entries: VecDeque<Entry>,
    /// The sum of their sizes.
    bytes: usize,
}

/// One owed release.
struct Entry {
    check: Check,
    /// When it was decided (its keys' windows are those of this time).
    at: Nanos,
    /// What it holds, as [`size_of`] counts it.
    size: usize,
}

/// An entry's bytes: the entry, its hold, its key and its ID.
fn size_of(check: &Check) -> usize {
    std::mem::size_of::<Entry>()
        + std::mem::size_of::<HoldCheck>()
        + check.key.as_bytes().len()
        + check.hold.as_ref().map_or(0, |h| h.id.len())
}

impl Entry {
    fn op(&self) -> Option<HoldOp> {
        self.check.hold.as_ref().map(|h| h.op)
    }
}

impl Owed {
    pub(super) fn new(options: &RedisOptions, events: Arc<Events>) -> Self {
        Self {
            kept: parking_lot::Mutex::default(),
            count: AtomicUsize::new(0),
            retry_at: AtomicU64::new(0),
            retry_every: u64::try_from(options.probe_interval.as_nanos()).unwrap_or(u64::MAX),
            max_bytes: options.max_owed_bytes,
            per_call: options.batch.requests.max(1),
            events,
        }
    }

    /// Keeps the releases among `checks` (decided at `now`) that `error`
    /// left unapplied, whatever it was (a release runs the same twice); the
    /// settlements only when the call `sent_nothing`.
    pub(super) fn keep(
        &self,
        checks: &[Check],
        now: Nanos,
        error: &StoreError,
        sent_nothing: bool,
    ) {
        if !checks.iter().any(Check::is_after_the_fact) {
            return;
        }
        tracing::debug!(%error, "a release Redis could not take is kept");
        let mut kept = self.kept.lock();
        for check in checks {
            let op = check.hold.as_ref().map(|h| h.op);
            if !(op == Some(HoldOp::Release) || (op == Some(HoldOp::Settle) && sent_nothing)) {
                continue;
            }
            let size = size_of(check);
            if kept.bytes + size > self.max_bytes {
                self.events.owing(Owing::Dropped);
                continue;
            }
            kept.bytes += size;
            let check = Check {
                outcome: None,
                ..check.clone()
            };
            kept.entries.push_back(Entry {
                check,
                at: now,
                size,
            });
        }
        self.counted(&kept);
    }

    /// Says how many are kept, to the sender and to `/metrics`.
    fn counted(&self, kept: &Kept) {
        self.count.store(kept.entries.len(), Ordering::Relaxed);
        self.events.owed(kept.entries.len());
    }

    /// The next ones to send at `now`, at most a call's worth; those that
    /// no longer matter are dropped (counted as lapsed): a slot held past
    /// its `max_hold_seconds`, a reservation whose window has ended.
    fn due(&self, now: Nanos) -> Vec<Entry> {
        let mut kept = self.kept.lock();
        let mut due = Vec::new();
        while due.len() < self.per_call {
            let Some(entry) = kept.entries.pop_front() else {
                break;
            };
            kept.bytes -= entry.size;
            let (check, at) = (&entry.check, entry.at);
            let lapsed = match entry.op() {
                Some(HoldOp::Settle) => check.quota.window_at(at).end * NANOS_PER_TICK <= now,
                _ => at.saturating_add(check.quota.period) <= now,
            };
            if lapsed {
                self.events.owing(Owing::Lapsed);
            } else {
                due.push(entry);
            }
        }
        self.counted(&kept);
        due
    }

    /// Keeps `again` (Redis failed them) first in line, in their order.
    fn put_back(&self, again: Vec<Entry>) {
        let mut kept = self.kept.lock();
        for entry in again.into_iter().rev() {
            kept.bytes += entry.size;
            kept.entries.push_front(entry);
        }
        self.counted(&kept);
    }
}

/// Sends one Redis's owed releases through its [`Exact`] layer.
pub(super) struct Payer {
    owed: Arc<Owed>,
    exact: Arc<Exact>,
    route: Route,
    timeout: Duration,
}

impl Payer {
    pub(super) fn new(owed: Arc<Owed>, exact: Arc<Exact>, route: Route, timeout: Duration) -> Self {
        Self {
            owed,
            exact,
            route,
            timeout,
        }
    }

    /// One pass at `now`, unless nothing is owed, the circuit is open or a
    /// pass failed within the probe interval: every entry sent once, in
    /// calls of at most `--redis-batch`, in the order kept. What Redis
    /// fails again is kept, first in line (a settlement only if the
    /// failure sent nothing, as when it was kept); the pass ends early
    /// when a whole call fails (Redis down again).
    async fn pay(&self, now: Nanos) {
        let owed = &self.owed;
        if owed.count.load(Ordering::Relaxed) == 0
            || self.route.stopped()
            || now < owed.retry_at.load(Ordering::Relaxed)
        {
            return;
        }
        let mut again = Vec::new();
        let mut failure = None;
        loop {
            let due = owed.due(now);
            if due.is_empty() {
                break;
            }
            let deadline = tokio::time::Instant::now() + self.timeout;
            let sent =
                futures_util::future::join_all(due.into_iter().map(|mut entry| async move {
                    let sent = self
                        .exact
                        .decide(std::slice::from_mut(&mut entry.check), entry.at, deadline)
                        .await;
                    (sent, entry)
                }))
                .await;
            let calls = sent.len();
            let mut failed = 0;
            for (result, entry) in sent {
                let Err(error) = result else {
                    owed.events.owing(Owing::Sent);
                    continue;
                };
                failed += 1;
                if entry.op() == Some(HoldOp::Settle) && !matches!(error, StoreError::CircuitOpen) {
                    // It may have run: sent twice, it would charge twice.
                    owed.events.owing(Owing::Dropped);
                } else {
                    again.push(entry);
                }
                failure.get_or_insert(error);
            }
            if failed == calls {
                break;
            }
        }
        if let Some(error) = failure {
            tracing::debug!(%error, "owed releases are kept for later");
            self.route.settle::<()>(&Err(error));
            owed.put_back(again);
            owed.retry_at
                .store(now.saturating_add(owed.retry_every), Ordering::Relaxed);
        }
    }
}

/// What this instance owes Redis, every pool's: the server calls
/// [`OwedReleases::pay`] every [`OWED_EVERY`], so what Redis could not take
/// reaches it soon after it answers again, whatever traffic this instance
/// gets.
pub struct OwedReleases(pub(super) Vec<Payer>);

impl std::fmt::Debug for OwedReleases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwedReleases").finish_non_exhaustive()
    }
}

impl OwedReleases {
    /// Sends, at `now`, what each Redis answering is owed.
    pub async fn pay(&self, now: Nanos) {
        for payer in &self.0 {
            payer.pay(now).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Quota};
    use crate::clock::NANOS_PER_SEC;
    use crate::period::Unit;
    use crate::store::{CounterKey, HoldCheck};

    const SEC: Nanos = NANOS_PER_SEC;

    /// `op` of `id` on a cap held at most a minute (a release, a take) or
    /// a budget of a minute's window (a settlement, a reservation).
    fn held(op: HoldOp, id: &str) -> Check {
        let algorithm = Algorithm::FixedWindow;
        let mut key = CounterKey::new("d", algorithm, Unit::Minute);
        key.entry("user", "ann");
        let mut check = Check::new(key, algorithm, Quota::new(5, 60 * SEC, 5), 1, true);
        check.hold = Some(Box::new(HoldCheck {
            op,
            id: id.as_bytes().into(),
            most: 5,
        }));
        check
    }

    /// Room for `entries` entries like [`held`]'s, `per_call` a call.
    fn owed(entries: usize, per_call: usize) -> Owed {
        let mut options = RedisOptions::new(super::super::RedisTarget::Standalone(String::new()));
        options.max_owed_bytes = entries * size_of(&held(HoldOp::Release, "a"));
        options.batch.requests = per_call;
        Owed::new(&options, Arc::default())
    }

    /// A release of `id` at `at` that the open circuit kept from Redis.
    fn release_unsent(o: &Owed, id: &str, at: Nanos) {
        o.keep(
            &[held(HoldOp::Release, id)],
            at,
            &StoreError::CircuitOpen,
            true,
        );
    }

    fn ids(due: &[Entry]) -> Vec<String> {
        due.iter()
            .map(|Entry { check: c, .. }| {
                String::from_utf8_lossy(&c.hold.as_ref().expect("held").id).into_owned()
            })
            .collect()
    }

    #[test]
    fn releases_are_kept_on_any_failure_settlements_only_when_nothing_was_sent() {
        let o = owed(100, 100);
        let request = [
            held(HoldOp::Release, "a"),
            held(HoldOp::Take, "b"),
            held(HoldOp::Settle, "c"),
            held(HoldOp::Reserve, "d"),
            Check::new(
                CounterKey::new("d", Algorithm::FixedWindow, Unit::Minute),
                Algorithm::FixedWindow,
                Quota::new(5, 60 * SEC, 5),
                1,
                true,
            ),
        ];
        // A timeout may have run the call: a settlement twice charges twice.
        o.keep(
            &request,
            SEC,
            &StoreError::Timeout(Duration::from_millis(1)),
            false,
        );
        assert_eq!(ids(&o.due(SEC)), ["a"]);
        // The breaker sent nothing: the settlement too, in their order.
        o.keep(&request, SEC, &StoreError::CircuitOpen, false);
        assert_eq!(
            ids(&o.due(SEC)),
            ["a"],
            "a Cluster's other slots may have run it"
        );
        o.keep(&request, SEC, &StoreError::CircuitOpen, true);
        assert_eq!(ids(&o.due(SEC)), ["a", "c"]);
        // Any error keeps a release (Redis refusing writes at maxmemory
        // sends an error no retry is sure to mend, and applies nothing).
        o.keep(&request, SEC, &StoreError::Script("OOM".into()), false);
        assert_eq!(ids(&o.due(SEC)), ["a"]);
        let seen = o.events.snapshot();
        assert_eq!((seen.owed_pending, seen.owed_dropped), (0, 0));
    }

    #[test]
    fn past_the_bound_a_release_is_dropped_and_counted() {
        let o = owed(2, 100);
        for id in ["a", "b", "c"] {
            release_unsent(&o, id, SEC);
        }
        assert_eq!(o.count.load(Ordering::Relaxed), 2);
        let seen = o.events.snapshot();
        assert_eq!((seen.owed_pending, seen.owed_dropped), (2, 1));
        assert_eq!(ids(&o.due(SEC)), ["a", "b"], "the oldest kept");
        assert_eq!(o.events.snapshot().owed_pending, 0);
        // None kept at all with a bound of 0.
        let none = owed(0, 100);
        release_unsent(&none, "a", SEC);
        assert!(none.due(SEC).is_empty());
    }

    #[test]
    fn the_bound_counts_bytes_so_long_keys_cannot_fill_memory() {
        let o = owed(4, 100);
        let mut long = held(HoldOp::Release, "long");
        long.key.entry("padding", &"x".repeat(10_000));
        o.keep(&[long], SEC, &StoreError::CircuitOpen, true);
        release_unsent(&o, "short", SEC);
        assert_eq!(ids(&o.due(SEC)), ["short"]);
        assert_eq!(o.events.snapshot().owed_dropped, 1);
        assert_eq!(o.kept.lock().bytes, 0, "what is taken is no longer counted");
    }

    #[test]
    fn a_call_takes_at_most_its_share_and_what_failed_goes_back_first() {
        let o = owed(100, 2);
        for id in ["a", "b", "c"] {
            release_unsent(&o, id, SEC);
        }
        let first = o.due(SEC);
        assert_eq!(ids(&first), ["a", "b"]);
        assert_eq!(o.count.load(Ordering::Relaxed), 1);
        o.put_back(first);
        assert_eq!(o.events.snapshot().owed_pending, 3);
        assert_eq!(ids(&o.due(SEC)), ["a", "b"]);
        assert_eq!(ids(&o.due(SEC)), ["c"]);
        assert!(o.due(SEC).is_empty());
    }

    #[test]
    fn what_has_lapsed_by_the_time_redis_answers_is_not_sent() {
        let o = owed(100, 100);
        // Kept at 10 s: a slot held at most a minute, a budget whose window
        // (this minute) ends at 60 s.
        release_unsent(&o, "slot", 10 * SEC);
        o.keep(
            &[held(HoldOp::Settle, "budget")],
            10 * SEC,
            &StoreError::CircuitOpen,
            true,
        );
        let late = o.due(60 * SEC);
        assert_eq!(
            ids(&late),
            ["slot"],
            "the window has ended; the slot is held till 70 s"
        );
        o.put_back(late);
        assert!(o.due(70 * SEC).is_empty());
        assert_eq!(o.events.snapshot().owed_lapsed, 2);
    }
}
