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
mod part;
mod per_second;
mod quota;
mod receipt;
mod refund;
mod reset;
mod script;
mod slots;
mod views;

use std::sync::Arc;

use super::{Check, StoreError};
use crate::clock::Nanos;
use breaker::Breaker;
pub use coalesce::BatchBounds;
use conn::Connections;
use error::redis_error;
use events::Events;
pub use events::RedisEvents;
use keys::Slot;
use options::config_error;
pub use options::{RedisOptions, RedisTarget, redact, url_prefix, userinfo_escape};
pub use over_limit::OverLimitCache;
pub use quota::{QuotaExchange, QuotaTotals};
use redis::Value;
pub use reset::{RESET_WATCH_EVERY, Wanted};
use script::Invocation;
use script::Scripts;

struct Inner {
    options: RedisOptions,
    /// This thread's connection, fresh ones for probes, Sentinel.
    connections: Connections,
    scripts: Scripts,
    breaker: Arc<Breaker>,
    /// Confirming PINGs and cancellations, for `/metrics`.
    events: Arc<Events>,
    /// Cluster routing: the slot map and each master's health.
    cluster: Option<cluster::Cluster>,
    over_limit: Option<OverLimitCache>,
    /// Local balances of leased keys (`consistency: leased`).
    leases: lease::Leases,
    /// The per-second pool: a store of its own for limits of one second.
    per_second: Option<RedisStore>,
}

/// The Redis or Redis Cluster store.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("target", &self.inner.options.target)
            .field("circuit_open", &self.circuit_open())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store for `options`. Connects lazily; see [`RedisStore::ping`].
    pub fn new(options: RedisOptions) -> Result<Self, StoreError> {
        // A brace would break the hash tag that keeps a descriptor's keys in one slot.
        if options.prefix.contains(['{', '}']) {
            return Err(StoreError::Config(format!(
                "Redis key prefix '{}' must not contain '{{' or '}}'",
                options.prefix
            )));
        }
        let urls = match &options.target {
            RedisTarget::Standalone(url) => vec![url.as_str()],
            RedisTarget::Cluster(nodes) => nodes.iter().map(String::as_str).collect(),
            RedisTarget::Sentinel { sentinels, .. } => {
                sentinels.iter().map(String::as_str).collect()
            }
        };
        if cfg!(not(feature = "insecure-redis-tls"))
            && urls.iter().any(|u| u.ends_with("#insecure"))
        {
            return Err(StoreError::Config(
                "this build does not skip Redis certificate checks (#insecure): give Redis's CA with --redis-tls-ca (or build with --features insecure-redis-tls)".into(),
            ));
        }
        // Validate the target now, so a bad URL stops start-up.
        match &options.target {
            RedisTarget::Standalone(url) => {
                redis::Client::open(url.as_str()).map_err(|e| config_error(url, &e))?;
            }
            RedisTarget::Cluster(nodes) => {
                redis::cluster::ClusterClient::new(nodes.clone())
                    .map_err(|e| config_error(&nodes.join(","), &e))?;
            }
            RedisTarget::Sentinel {
                master,
                sentinels,
                master_prefix,
            } => {
                if master.is_empty() || sentinels.is_empty() {
                    return Err(StoreError::Config(
                        "Redis Sentinel needs the master's name and at least one sentinel".into(),
                    ));
                }
                for url in sentinels {
                    redis::Client::open(url.as_str()).map_err(|e| config_error(url, &e))?;
                }
                let example = format!("{master_prefix}127.0.0.1:6379");
                redis::Client::open(example.as_str()).map_err(|e| config_error(&example, &e))?;
            }
        }
        let per_second = match &options.per_second {
            None => None,
            Some(options) => {
                let mut options = (**options).clone();
                options.per_second = None;
                Some(RedisStore::new(options)?)
            }
        };
        let cluster = match &options.target {
            RedisTarget::Cluster(nodes) => Some(cluster::Cluster::new(nodes.clone())),
            _ => None,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                connections: Connections::new(&options),
                over_limit: options.over_limit_cache.then(OverLimitCache::default),
                options,
                scripts: Scripts::default(),
                breaker: Arc::default(),
                events: Arc::default(),
                cluster,
                leases: lease::Leases::default(),
                per_second,
            }),
        })
    }

    /// Whether a circuit is open: Redis considered down or, on a Cluster,
    /// at least one master (whose slots get the failure modes).
    pub fn circuit_open(&self) -> bool {
        self.inner.breaker.is_open()
            || self
                .inner
                .cluster
                .as_ref()
                .is_some_and(|c| !c.open_masters().is_empty())
    }

    /// The breaker's confirming PINGs and the cancellations of calls with
    /// no answer, this store's and its per-second pool's together.
    pub fn events(&self) -> RedisEvents {
        let own = self.inner.events.snapshot();
        match &self.inner.per_second {
            Some(pool) => own + pool.events(),
            None => own,
        }
    }

    /// Cluster masters whose circuit is open (none off a Cluster).
    pub fn open_masters(&self) -> Vec<String> {
        self.inner
            .cluster
            .as_ref()
            .map(cluster::Cluster::open_masters)
            .unwrap_or_default()
    }

    /// Runs `inv`: on the server (standalone, or Sentinel's master), or on
    /// the Cluster master serving `slot`.
    async fn invoke(&self, slot: Slot, inv: &Invocation<'_>) -> Result<Value, StoreError> {
        if self.inner.cluster.is_some() {
            // Boxed: large, and Cluster only.
            return Box::pin(self.invoke_cluster(slot, inv)).await;
        }
        let mut conn = self.inner.connections.shared(&self.inner.breaker).await?;
        inv.run(&mut conn, false).await.map_err(|e| redis_error(&e))
    }

    /// Sends PING on this thread's connection (each master's, on a
    /// Cluster), within the store's timeout; the per-second pool's too.
    pub async fn ping(&self) -> Result<(), StoreError> {
        if self.inner.cluster.is_some() {
            Box::pin(self.ping_cluster()).await?;
        } else {
            self.inner.connections.ping(&self.inner.breaker).await?;
        }
        match &self.inner.per_second {
            Some(per_second) => Box::pin(per_second.ping()).await,
            None => Ok(()),
        }
    }

    /// Connects afresh and sends PING, within the probe timeout (see
    /// [`Connections::probe`]).
    pub async fn probe(&self) -> Result<(), StoreError> {
        if self.inner.cluster.is_some() {
            return Box::pin(self.ping_cluster()).await;
        }
        self.inner.connections.probe(&self.inner.breaker).await
    }

    /// Decides `checks` at `now`, all or nothing.
    pub async fn decide(&self, checks: &mut [Check], now: Nanos) -> Result<(), StoreError> {
        if checks.iter().any(|c| c.lease > 0) {
            return self.decide_leased(checks, now).await;
        }
        self.decide_exact(checks, now).await
    }

    /// Decides `checks` at `now` in Redis, all or nothing: on this store,
    /// or across it and the per-second pool.
    async fn decide_exact(&self, checks: &mut [Check], now: Nanos) -> Result<(), StoreError> {
        if let Some(per_second) = &self.inner.per_second
            && checks.iter().any(per_second::is_per_second)
        {
            // Boxed: only with a per-second pool; every request's future
            // would carry it otherwise.
            return Box::pin(self.decide_split(per_second, checks, now)).await;
        }
        self.decide_here(checks, now).await
    }

    /// Decides `checks` at `now` in this store's Redis, all or nothing.
    async fn decide_here(&self, checks: &mut [Check], now: Nanos) -> Result<(), StoreError> {
        // Before the circuit: a key known to be over its limit stays refused
        // while Redis is down, whatever the failure mode says.
        if let Some(cache) = &self.inner.over_limit
            && cache.answer(checks, now)
        {
            return Ok(());
        }
        // (A Cluster's masters have a breaker each: see cluster.rs.)
        if self.inner.breaker.is_open() {
            return Err(StoreError::CircuitOpen);
        }
        // One bound for the decision, from now: connecting (first use, or
        // after an outage) and the script calls. The coalescer holds each
        // request to it (see coalesce.rs) with one timer per script call, not
        // one per request. A refusal is final once decided: the Cluster
        // refund runs after, under its own bound, so a slow refund can never
        // turn a refusal into a failure-mode admission.
        let deadline = tokio::time::Instant::now() + self.inner.options.timeout;
        let result = self.call(checks, now, deadline).await;
        match result {
            Ok(groups) => {
                self.inner.breaker.record_ok();
                if let Some(cache) = &self.inner.over_limit {
                    cache.remember(checks, now);
                }
                if groups.len() > 1 {
                    // Boxed: Cluster only, and large; every request's
                    // future would carry it.
                    Box::pin(self.keep_all_or_nothing(checks, &groups, now)).await;
                }
                Ok(())
            }
            Err(e) => {
                if e.is_transient() && self.inner.cluster.is_none() {
                    self.failed(&e);
                    // Behind Sentinel, a failing master may have been
                    // replaced (a demoted one answers READONLY): every
                    // worker asks the sentinels again on its next call.
                    if matches!(self.inner.options.target, RedisTarget::Sentinel { .. }) {
                        self.inner.breaker.reconnect();
                    }
                }
                Err(e)
            }
        }
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
        assert!(size <= 2_048, "RedisStore::decide's future is {size} bytes");
    }
}
