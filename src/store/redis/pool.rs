//! One Redis deployment (a server, Sentinel's master, or a Cluster) and how
//! a request is decided on it: the over-limit cache, the breaker, then
//! [`Exact`] by the request's deadline; and what it owes Redis, the
//! releases Redis could not take while it was down. The store has one, and
//! a second for limits of one second when `--redis-per-second-url` is given.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::events::{Events, Owing};
use super::keys::{self, KeyNames};
use super::options::RedisOptions;
use super::over_limit::OverLimitCache;
use super::reset::Counters;
use super::route::Route;
use super::server::Server;
use super::slots::Exact;
use crate::algorithm::{HoldOp, NANOS_PER_TICK};
use crate::clock::Nanos;
use crate::store::{Check, StoreError};

/// One Redis and the layers over it.
pub(super) struct Pool {
    route: Route,
    exact: Arc<Exact>,
    owed: Arc<Owed>,
    over_limit: Option<Arc<OverLimitCache>>,
    counters: Counters,
    /// What the layers did in the background, for `/metrics`.
    events: Arc<Events>,
    timeout: Duration,
    prefix: String,
}

impl Pool {
    /// The layers over `options`' target; connects on first use.
    pub(super) fn new(options: &RedisOptions) -> Self {
        let events = Arc::<Events>::default();
        let route = Route::new(options, events.clone());
        Self {
            exact: Arc::new(Exact::new(&route, options, events.clone())),
            owed: Arc::new(Owed {
                kept: parking_lot::Mutex::default(),
                count: AtomicUsize::new(0),
                sending: AtomicBool::new(false),
                retry_at: AtomicU64::new(0),
                retry_every: u64::try_from(options.probe_interval.as_nanos()).unwrap_or(u64::MAX),
                max: options.max_owed,
                per_call: options.batch.requests.max(1),
                events: events.clone(),
            }),
            counters: Counters::new(route.clone(), options),
            over_limit: options
                .over_limit_cache
                .then(|| Arc::new(OverLimitCache::default())),
            route,
            events,
            timeout: options.timeout,
            prefix: options.prefix.clone(),
        }
    }

    /// Where its calls go.
    pub(super) fn route(&self) -> &Route {
        &self.route
    }

    /// Its counters' keys, for resets.
    pub(super) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Its over-limit cache, when it keeps one.
    pub(super) fn over_limit(&self) -> Option<Arc<OverLimitCache>> {
        self.over_limit.clone()
    }

    /// Forgets every refusal the over-limit cache remembers (a reset), as
    /// the other instances do when they see the reset: a key's refusal is
    /// remembered per priority lane too, which a reset's descriptor does
    /// not name.
    pub(super) fn forget_refusals(&self) {
        if let Some(cache) = &self.over_limit {
            cache.clear();
        }
    }

    /// Decides `checks` at `now` on this Redis, all or nothing.
    pub(super) async fn decide(&self, checks: &mut [Check], now: Nanos) -> Result<(), StoreError> {
        // Before the circuit: a key known to be over its limit stays refused
        // while Redis is down, whatever the failure mode says.
        if let Some(cache) = &self.over_limit
            && cache.answer(checks, now)
        {
            return Ok(());
        }
        // (A Cluster's masters have a breaker each: see cluster/mod.rs.)
        if self.route.stopped() {
            self.owed.keep(checks, now, &StoreError::CircuitOpen, true);
            return Err(StoreError::CircuitOpen);
        }
        // One bound for the decision, from now: connecting (first use, or
        // after an outage) and the script calls. The coalescer holds each
        // request to it (see coalesce.rs) with one timer per script call, not
        // one per request. A refusal is final once decided: the Cluster
        // refund runs after, under its own bound, so a slow refund can never
        // turn a refusal into a failure-mode admission.
        let deadline = tokio::time::Instant::now() + self.timeout;
        let result = self.exact.decide(checks, now, deadline).await;
        self.route.settle(&result);
        let groups = match result {
            Ok(groups) => groups,
            Err(error) => {
                // A Cluster master's open circuit sent nothing, unless the
                // request's other slots were sent.
                let sent_nothing = matches!(error, StoreError::CircuitOpen)
                    && (!self.route.clustered() || self.one_slot(checks, now));
                self.owed.keep(checks, now, &error, sent_nothing);
                return Err(error);
            }
        };
        if self.owed.count.load(Ordering::Relaxed) != 0 {
            // Redis answers again: what it could not take is sent now.
            self.pay_owed(now);
        }
        if let Some(cache) = &self.over_limit {
            cache.remember(checks, now);
        }
        if groups.len() > 1 {
            // Boxed: Cluster only, and large; every request's future would
            // carry it.
            Box::pin(self.exact.keep_all_or_nothing(checks, &groups, now)).await;
        }
        Ok(())
    }

    /// Takes back what the admitted `checks` spent at `now` (refused as a
    /// whole on the other pool).
    pub(super) async fn give_back(&self, checks: &[Check], now: Nanos) {
        self.exact.give_back(checks, now).await;
    }

    /// A fresh connection and a PING, within the probe timeout.
    pub(super) async fn probe(&self) -> Result<(), StoreError> {
        self.route.probe().await
    }

    /// What the layers did in the background.
    pub(super) fn events(&self) -> &Arc<Events> {
        &self.events
    }

    /// Whether `checks` at `now` are all in one hash slot.
    fn one_slot(&self, checks: &[Check], now: Nanos) -> bool {
        let mut slots = checks
            .iter()
            .map(|c| keys::slot_of(KeyNames::of_check(&self.prefix, c, now).first().as_bytes()));
        let first = slots.next();
        slots.all(|s| Some(s) == first)
    }

    /// Sends what is owed, in the background on this thread's runtime (one
    /// sending at a time, at most once per probe interval), at `now`: in
    /// calls of at most `--redis-batch`, in the order kept, once each. What
    /// Redis fails again is kept, first in line (a settlement only if the
    /// failure sent nothing, as when it was kept); the pass ends early when
    /// a whole call fails (Redis down again).
    fn pay_owed(&self, now: Nanos) {
        if now < self.owed.retry_at.load(Ordering::Relaxed)
            || self.owed.sending.swap(true, Ordering::Acquire)
        {
            return;
        }
        let (owed, exact, route) = (self.owed.clone(), self.exact.clone(), self.route.clone());
        let timeout = self.timeout;
        tokio::spawn(async move {
            let _sending = Sending(&owed);
            let mut again = Vec::new();
            let mut failure = None;
            loop {
                let due = owed.due(now);
                if due.is_empty() {
                    break;
                }
                let deadline = tokio::time::Instant::now() + timeout;
                let sent =
                    futures_util::future::join_all(due.into_iter().map(|(mut check, at)| {
                        let exact = &exact;
                        async move {
                            let sent = exact
                                .decide(std::slice::from_mut(&mut check), at, deadline)
                                .await;
                            (sent, check, at)
                        }
                    }))
                    .await;
                let calls = sent.len();
                let mut failed = 0;
                for (result, check, at) in sent {
                    let Err(error) = result else {
                        owed.events.owing(Owing::Sent);
                        continue;
                    };
                    failed += 1;
                    let settles = check.hold.as_ref().is_some_and(|h| h.op == HoldOp::Settle);
                    if settles && !matches!(error, StoreError::CircuitOpen) {
                        // It may have run: sent twice, it would charge twice.
                        owed.events.owing(Owing::Dropped);
                    } else {
                        again.push((check, at));
                    }
                    failure.get_or_insert(error);
                }
                if failed == calls {
                    break;
                }
            }
            if let Some(error) = failure {
                route.settle::<()>(&Err(error));
                owed.put_back(again);
                owed.retry_at
                    .store(now.saturating_add(owed.retry_every), Ordering::Relaxed);
            }
        });
    }
}

/// Releases Redis could not take (an in-flight cap's, and a budget's
/// settlement that was never sent), in the order they came, sent again once
/// it answers: otherwise each freed slot would stay held until
/// `max_hold_seconds`, each settled reservation charged until its window
/// ends. A release is the same whether it runs once or twice (the ID is
/// gone); a settlement is not, so only one the breaker kept from Redis is
/// kept (one that timed out may have run: see receipt.rs).
struct Owed {
    /// The checks and the times they were decided at, oldest first.
    kept: parking_lot::Mutex<VecDeque<(Check, Nanos)>>,
    /// How many are kept: read by every decision, written only on a
    /// failure and when they are sent.
    count: AtomicUsize,
    /// Whether a task is sending them.
    sending: AtomicBool,
    /// After a pass Redis failed, no other before this time (the probe
    /// interval later): a Cluster master still down would otherwise have
    /// every decision on the others start a pass.
    retry_at: AtomicU64,
    retry_every: Nanos,
    /// The most kept (`--redis-max-owed-releases`); past it the newest are
    /// not kept (counted as dropped).
    max: usize,
    /// Checks sent together.
    per_call: usize,
    events: Arc<Events>,
}

/// Marks the sending over, however its task ends.
struct Sending<'a>(&'a Owed);

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.0.sending.store(false, Ordering::Release);
    }
}

impl Owed {
    /// Keeps the releases among `checks` (decided at `now`) that `error`
    /// left unapplied; the settlements too when the call was `sent_nothing`.
    fn keep(&self, checks: &[Check], now: Nanos, error: &StoreError, never_sent: bool) {
        if !error.is_transient() || !checks.iter().any(Check::is_after_the_fact) {
            return;
        }
        let mut kept = self.kept.lock();
        for check in checks {
            let op = check.hold.as_ref().map(|h| h.op);
            if !(op == Some(HoldOp::Release) || (op == Some(HoldOp::Settle) && never_sent)) {
                continue;
            }
            if kept.len() >= self.max {
                self.events.owing(Owing::Dropped);
                continue;
            }
            kept.push_back((
                Check {
                    outcome: None,
                    ..check.clone()
                },
                now,
            ));
            self.events.owing(Owing::Kept);
        }
        self.count.store(kept.len(), Ordering::Relaxed);
    }

    /// The next ones to send at `now`, at most a call's worth; those that
    /// no longer matter are dropped (counted as lapsed): a slot held past
    /// its `max_hold_seconds`, a reservation whose window has ended.
    fn due(&self, now: Nanos) -> Vec<(Check, Nanos)> {
        let mut kept = self.kept.lock();
        let mut due = Vec::new();
        while due.len() < self.per_call {
            let Some((check, at)) = kept.pop_front() else {
                break;
            };
            self.events.owing(Owing::Taken);
            let lapsed = match check.hold.as_ref().map(|h| h.op) {
                Some(HoldOp::Settle) => check.quota.window_at(at).end * NANOS_PER_TICK <= now,
                _ => at.saturating_add(check.quota.period) <= now,
            };
            if lapsed {
                self.events.owing(Owing::Lapsed);
            } else {
                due.push((check, at));
            }
        }
        self.count.store(kept.len(), Ordering::Relaxed);
        due
    }

    /// Keeps `again` (Redis failed them) first in line, in their order.
    fn put_back(&self, again: Vec<(Check, Nanos)>) {
        let mut kept = self.kept.lock();
        for entry in again.into_iter().rev() {
            kept.push_front(entry);
            self.events.owing(Owing::Kept);
        }
        self.count.store(kept.len(), Ordering::Relaxed);
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

    fn owed(max: usize, per_call: usize) -> Owed {
        Owed {
            kept: parking_lot::Mutex::default(),
            count: AtomicUsize::new(0),
            sending: AtomicBool::new(false),
            retry_at: AtomicU64::new(0),
            retry_every: SEC / 4,
            max,
            per_call,
            events: Arc::default(),
        }
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

    fn ids(due: &[(Check, Nanos)]) -> Vec<String> {
        due.iter()
            .map(|(c, _)| String::from_utf8_lossy(&c.hold.as_ref().expect("held").id).into_owned())
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
        // An error that no retry mends keeps nothing.
        o.keep(&request, SEC, &StoreError::Script("bad".into()), true);
        assert!(o.due(SEC).is_empty());
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
