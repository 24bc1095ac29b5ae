//! One Redis deployment (a server, Sentinel's master, or a Cluster) and how
//! a request is decided on it: the over-limit cache, the breaker, then
//! [`Exact`] by the request's deadline; and what it owes Redis, the
//! releases Redis could not take while it was down. The store has one, and
//! a second for limits of one second when `--redis-per-second-url` is given.

use std::sync::Arc;
use std::time::Duration;

use super::events::Events;
use super::keys::{self, KeyNames};
use super::options::RedisOptions;
use super::over_limit::OverLimitCache;
use super::owed::{Owed, Payer};
use super::reset::Counters;
use super::route::Route;
use super::server::Server;
use super::slots::Exact;
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
            owed: Arc::new(Owed::new(options, events.clone())),
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

    /// Who sends what it owes (see owed.rs).
    pub(super) fn payer(&self) -> Payer {
        Payer::new(
            self.owed.clone(),
            self.exact.clone(),
            self.route.clone(),
            self.timeout,
        )
    }

    /// Whether `checks` at `now` are all in one hash slot.
    fn one_slot(&self, checks: &[Check], now: Nanos) -> bool {
        let mut slots = checks
            .iter()
            .map(|c| keys::slot_of(KeyNames::of_check(&self.prefix, c, now).first().as_bytes()));
        let first = slots.next();
        slots.all(|s| Some(s) == first)
    }
}
