//! Redis and Redis Cluster: each request's checks decided together by one
//! Lua script (per hash slot in Cluster), in calls that carry up to
//! `--redis-batch` requests each (see coalesce.rs).
//!
//! **Time** comes from the caller (Tollgate's clock), not from Redis `TIME`:
//! key names carry the window number, and Redis Cluster routes a script by
//! the keys declared before it runs, so the caller must know the window. The
//! price is that instances' clocks must agree (NTP keeps them within
//! milliseconds, small against windows of a second or more).
//!
//! **Connections** (conn.rs) are the `redis` crate's multiplexed async connections, one
//! per worker thread (made on first use, on that thread's runtime), so the
//! calls of concurrent requests on a worker are pipelined on one connection
//! with no cross-thread hops. They reconnect by themselves.
//!
//! **Failure**: every request has a deadline, `timeout` from when it asks
//! (see coalesce.rs for how queued requests keep it). After `breaker_threshold` failures in
//! a row the store stops calling Redis (each decision fails at once, and the
//! limiter answers from the failure modes) and probes Redis in the background
//! until it answers. The outage and the recovery are logged once each. On a
//! Cluster each master has a breaker of its own (see cluster/mod.rs), and a call
//! with no answer is taken back if it runs late (see receipt.rs).
//!
//! **Layers.** Each owns its state and calls only the one below:
//! [`RedisStore`] (this file: leases, then the per-second split) over a
//! [`pool::Pool`] per Redis (the over-limit cache, the breaker, the
//! deadline) over [`slots::Exact`] (all or nothing across hash slots,
//! refunds, migrating slots) over [`coalesce::Batcher`] (one call for the
//! requests of the moment) over [`receipt::Calls`] (a call and its
//! receipt) over [`route::Route`] (one server, or a Cluster with a breaker
//! per master, cluster/mod.rs). Resets, shared views and the quota
//! exchange are types of their own over a `Route` (reset.rs, views.rs,
//! quota.rs).

mod breaker;
mod cluster;
mod coalesce;
mod conn;
mod error;
mod events;
mod keys;
mod lease;
mod migration;
mod msgpack;
mod options;
mod over_limit;
mod owed;
mod part;
mod per_second;
mod pool;
mod quota;
mod receipt;
mod refund;
mod reset;
mod route;
mod script;
mod server;
mod slots;
mod views;

use std::sync::Arc;

use super::{Check, ResetError, StoreError};
use crate::clock::Nanos;
pub use events::RedisEvents;
use lease::Leases;
pub use options::{BatchBounds, RedisOptions, RedisTarget, redact, url_prefix, userinfo_escape};
pub use over_limit::OverLimitCache;
pub use owed::{OWED_EVERY, OwedReleases};
use pool::Pool;
use quota::Quotas;
pub use quota::{QuotaExchange, QuotaTotals};
pub use reset::{RESET_WATCH_EVERY, ResetWatch, Wanted};
use server::Server;
use views::Views;

/// The Redis or Redis Cluster store.
pub struct RedisStore {
    target: RedisTarget,
    /// The Redis of every limit, or of every limit but those of one second.
    main: Pool,
    /// The per-second pool: limits of one second, on a Redis of their own.
    per_second: Option<Pool>,
    /// Local balances of leased keys (`consistency: leased`).
    leases: Arc<Leases>,
    views: Views,
    quotas: Quotas,
    status: RedisStatus,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.target)
            .field("circuit_open", &self.circuit_open())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store for `options`. Connects lazily; see [`RedisStore::ping`].
    pub fn new(options: RedisOptions) -> Result<Self, StoreError> {
        options.validate()?;
        let per_second = match &options.per_second {
            None => None,
            Some(pool) => {
                let mut pool = (**pool).clone();
                pool.per_second = None;
                pool.validate()?;
                Some(Pool::new(&pool))
            }
        };
        let main = Pool::new(&options);
        let status = RedisStatus {
            pools: std::iter::once(&main)
                .chain(&per_second)
                .map(|pool| (pool.route().clone(), pool.events().clone()))
                .collect(),
        };
        Ok(Self {
            status,
            views: Views::new(main.route().clone(), &options),
            quotas: Quotas::new(main.route().clone(), &options),
            target: options.target,
            main,
            per_second,
            leases: Arc::default(),
        })
    }

    /// The pools, the main one first.
    fn pools(&self) -> impl Iterator<Item = &Pool> {
        std::iter::once(&self.main).chain(&self.per_second)
    }

    /// `checks` by the pool that holds each (the per-second pool's first),
    /// leaving out a pool none of them is in.
    fn pools_of(&self, checks: &[Check]) -> Vec<(&Pool, Vec<Check>)> {
        let (pooled, main): (Vec<Check>, Vec<Check>) = checks
            .iter()
            .cloned()
            .partition(|c| self.per_second.is_some() && per_second::is_per_second(c));
        let mut pools = Vec::with_capacity(2);
        if let Some(pool) = &self.per_second
            && !pooled.is_empty()
        {
            pools.push((pool, pooled));
        }
        if !main.is_empty() {
            pools.push((&self.main, main));
        }
        pools
    }

    /// Whether a circuit is open: Redis considered down or, on a Cluster,
    /// at least one master (whose slots get the failure modes).
    pub fn circuit_open(&self) -> bool {
        self.status.circuit_open()
    }

    /// The store's health as a handle (see [`RedisStatus`]).
    pub fn status(&self) -> RedisStatus {
        self.status.clone()
    }

    /// Cluster masters whose circuit is open (none off a Cluster).
    pub fn open_masters(&self) -> Vec<String> {
        self.main.route().open_masters()
    }

    /// Sends PING on this thread's connection (each master's, on a
    /// Cluster), within the store's timeout; the per-second pool's too.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.status.ping().await
    }

    /// Connects afresh and sends PING, within the probe timeout.
    pub async fn probe(&self) -> Result<(), StoreError> {
        self.main.probe().await
    }

    /// The instances' shared views of who is limited.
    pub fn views(&self) -> ViewShare {
        ViewShare(self.views.clone())
    }

    /// The quota service's exchange between instances.
    pub fn quotas(&self) -> QuotaShare {
        QuotaShare(self.quotas.clone())
    }

    /// Decides `checks` at `now`, all or nothing: from leases where they
    /// suffice, then in Redis (across the per-second pool when it holds
    /// some of them).
    pub async fn decide(&self, checks: &mut [Check], now: Nanos) -> Result<(), StoreError> {
        if checks.iter().any(|c| c.lease > 0) {
            let exact = async |asked: &mut [Check]| self.decide_exact(asked, now).await;
            return self.leases.decide(checks, now, exact).await;
        }
        self.decide_exact(checks, now).await
    }

    /// Decides `checks` at `now` in Redis, all or nothing: on the main
    /// pool, or across it and the per-second pool.
    async fn decide_exact(&self, checks: &mut [Check], now: Nanos) -> Result<(), StoreError> {
        if let Some(per_second) = &self.per_second
            && checks.iter().any(per_second::is_per_second)
        {
            // Boxed: only with a per-second pool; every request's future
            // would carry it otherwise.
            return Box::pin(per_second::decide_split(
                &self.main, per_second, checks, now,
            ))
            .await;
        }
        self.main.decide(checks, now).await
    }

    /// Deletes the counters of `checks` at `now` (a sliding window's
    /// previous window too), each on the Redis that holds it; every instance
    /// forgets what it remembers of them. Returns how many existed.
    pub async fn reset(&self, checks: &[Check], now: Nanos) -> Result<usize, StoreError> {
        let mut deleted = 0;
        for (pool, checks) in self.pools_of(checks) {
            deleted += pool.counters().delete_checks(&checks, now).await?;
            pool.forget_refusals();
            self.leases.forget(&checks);
        }
        self.main.counters().announce().await?;
        Ok(deleted)
    }

    /// Deletes every counter of `domain` that `wanted` accepts (`None`:
    /// all), here and in the per-second pool: at most `max` of them (more:
    /// nothing is deleted). Every instance forgets what it remembers.
    pub(crate) async fn reset_bulk(
        &self,
        domain: &str,
        wanted: Option<Wanted<'_>>,
        max: usize,
    ) -> Result<usize, ResetError> {
        let mut found = Vec::new();
        let mut total = 0;
        for pool in self.pools() {
            let names = Box::pin(pool.counters().matching(domain, wanted, max))
                .await
                .map_err(ResetError::Store)?;
            total += names.len();
            found.push((pool, names));
        }
        if total > max {
            return Err(ResetError::TooMany(max));
        }
        let mut deleted = 0;
        for (pool, names) in found {
            deleted += Box::pin(pool.counters().delete(names))
                .await
                .map_err(ResetError::Store)?;
        }
        self.watch().forget_all();
        self.main
            .counters()
            .announce()
            .await
            .map_err(ResetError::Store)?;
        Ok(deleted)
    }

    /// What this instance owes Redis (releases it could not take), every
    /// pool's, for the server to send in the background.
    pub fn owed(&self) -> OwedReleases {
        OwedReleases(self.pools().map(Pool::payer).collect())
    }

    /// What an instance watches to learn of other instances' resets.
    pub fn watch(&self) -> ResetWatch {
        ResetWatch::new(
            self.main.counters().clone(),
            self.pools().filter_map(Pool::over_limit).collect(),
            self.leases.clone(),
        )
    }
}

/// A Redis store's health, for the readiness checks and `/metrics`: its
/// circuits, a PING, its background events; nothing that decides or
/// resets. Cheap to clone.
#[derive(Clone)]
pub struct RedisStatus {
    /// Each pool's route and events, the main pool's first.
    pools: Vec<(route::Route, Arc<events::Events>)>,
}

impl RedisStatus {
    /// Whether the main pool's circuit is open (the server's, or a Cluster
    /// master's).
    pub fn circuit_open(&self) -> bool {
        self.pools
            .first()
            .is_some_and(|(route, _)| route.circuit_open())
    }

    /// PING on this thread's connection (each master's, on a Cluster), the
    /// per-second pool's too.
    pub async fn ping(&self) -> Result<(), StoreError> {
        for (route, _) in &self.pools {
            route.ping().await?;
        }
        Ok(())
    }

    /// The breaker's confirming PINGs and the cancellations of calls with
    /// no answer, every pool's together.
    pub fn events(&self) -> RedisEvents {
        self.pools
            .iter()
            .map(|(_, events)| events.snapshot())
            .fold(RedisEvents::default(), |a, b| a + b)
    }
}

/// The instances' shared views of who is limited, in Redis.
#[derive(Clone)]
pub struct ViewShare(Views);

impl std::fmt::Debug for ViewShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewShare").finish_non_exhaustive()
    }
}

impl ViewShare {
    /// Stores `view` (JSON) as `instance`'s, kept `keep` after it was
    /// written, unless it is above `max_bytes` (then it is not written, and
    /// the error says so).
    pub async fn put(
        &self,
        instance: &str,
        view: &str,
        bounds: (std::time::Duration, usize),
    ) -> Result<(), StoreError> {
        self.0.put(instance, view, bounds).await
    }

    /// The instances' views written within `keep`, at most `max_views` of
    /// them, each at most `max_bytes`: `(instance, view)` pairs.
    pub async fn get(
        &self,
        bounds: (std::time::Duration, usize, usize),
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.0.get(bounds).await
    }
}

/// The quota service's exchange of weights and usage between instances.
#[derive(Clone)]
pub struct QuotaShare(Quotas);

impl std::fmt::Debug for QuotaShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaShare").finish_non_exhaustive()
    }
}

impl QuotaShare {
    /// The exchange for `exchanges`, every bucket within `within`: each
    /// bucket's totals, or why they are not known.
    pub async fn exchange(
        &self,
        exchanges: &[QuotaExchange<'_>],
        within: std::time::Duration,
    ) -> Vec<Result<QuotaTotals, StoreError>> {
        self.0.exchange(exchanges, within).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every request's future carries the store's; the large parts (the
    /// client's call, the Cluster refund, the exact path behind a lease) are
    /// boxed so that a request does not carry and move kilobytes. Measured:
    /// 4,368 bytes before they were boxed, 1,768 after; 1,704 with the
    /// leader's part boxed (its deadline beside it).
    #[test]
    fn a_requests_future_stays_small() {
        let store = RedisStore::new(RedisOptions::new(RedisTarget::Standalone(
            "redis://127.0.0.1:1".into(),
        )))
        .expect("a store (it connects on first use)");
        let mut checks: Vec<Check> = Vec::new();
        let size = std::mem::size_of_val(&store.decide(&mut checks, 0));
        eprintln!("RedisStore::decide: {size} bytes");
        assert!(size <= 2_048, "RedisStore::decide's future is {size} bytes");
    }

    /// A call's future is boxed by the leader that sends it: built on the
    /// stack, then copied to the heap, for every call. Connecting (a deep
    /// future, behind Sentinel the sentinels first) is boxed apart, so a
    /// call does not carry it: carried, it made the call 8,640 bytes in a
    /// release build, copied once per request (callgrind: 12 % of the
    /// instructions of a request on one hot key).
    #[test]
    fn a_calls_future_does_not_carry_connecting() {
        let options = RedisOptions::new(RedisTarget::Standalone("redis://127.0.0.1:1".into()));
        let events = Arc::<events::Events>::default();
        let route = route::Route::new(&options, events.clone());
        let calls = receipt::Calls::new(route, &options, events);
        let size = std::mem::size_of_val(&calls.send(0, &[], tokio::time::Instant::now()));
        eprintln!("Calls::send: {size} bytes");
        assert!(size <= 4_096, "Calls::send's future is {size} bytes");
    }
}
