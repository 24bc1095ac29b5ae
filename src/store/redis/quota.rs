//! The rate limit quota (RLQS) exchange: each instance reports its clients'
//! weight and what it admitted, and learns everyone's (see `quota.lua`).

use redis::Value;

use super::RedisStore;
use super::keys::quota_key_names;
use crate::algorithm::NANOS_PER_TICK;
use crate::calendar::Window;
use crate::clock::Nanos;
use crate::store::StoreError;

/// One instance's report for a quota bucket: see [`RedisStore::exchange_quota`].
#[derive(Debug)]
pub struct QuotaExchange<'a> {
    /// The stream's domain.
    pub domain: &'a str,
    /// The bucket's entries, sorted by key.
    pub entries: &'a [(String, String)],
    /// This Tollgate instance.
    pub instance: &'a str,
    /// The weight of this instance's clients (requests per second).
    pub weight: f64,
    /// Requests admitted since the last exchange.
    pub admitted: u64,
    /// The limit's current window.
    pub window: Window,
    /// Now.
    pub now: Nanos,
    /// How long an instance's weight counts without an update.
    pub stale: Nanos,
}

/// What every instance reported for a quota bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaTotals {
    /// Weights of every live instance, added up.
    pub weight: f64,
    /// Admitted in the window by all instances.
    pub used: u64,
}

impl RedisStore {
    /// One Tollgate instance's exchange for a rate limit quota (RLQS) bucket
    /// (see `quota.lua`): records `instance`'s weight and `admitted` in
    /// `window`, and answers the weight of every instance heard from within
    /// `stale`, and what all of them admitted in the window.
    pub async fn exchange_quota(
        &self,
        exchange: &QuotaExchange<'_>,
    ) -> Result<QuotaTotals, StoreError> {
        if self.inner.breaker.is_open() {
            return Err(StoreError::CircuitOpen);
        }
        let [weights, used] = quota_key_names(
            &self.inner.options.prefix,
            exchange.domain,
            exchange.entries,
            exchange.window.index,
        );
        let now_us = exchange.now / NANOS_PER_TICK;
        // The window's counter lives until the window ends, and a little
        // longer for instances whose clocks run behind.
        let ttl_ms = exchange.window.end.saturating_sub(now_us) / 1000 + 60_000;
        let weight = (exchange.weight.max(0.0) * 1e6).min(9e15) as u64;
        let mut invocation = self.inner.quota.prepare_invoke();
        invocation
            .key(weights)
            .key(used)
            .arg(exchange.instance)
            .arg(weight)
            .arg(now_us)
            .arg(exchange.stale / NANOS_PER_TICK)
            .arg(exchange.admitted)
            .arg(ttl_ms.max(1));
        let timeout = self.inner.options.timeout;
        let reply = tokio::time::timeout(timeout, self.invoke(invocation.slot(), &invocation))
            .await
            .map_err(|_| StoreError::Timeout(timeout))??;
        match reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(total), Value::Int(used)] => Ok(QuotaTotals {
                    weight: *total as f64 / 1e6,
                    used: (*used).max(0) as u64,
                }),
                _ => Err(StoreError::Script(format!(
                    "unexpected quota reply {items:?}"
                ))),
            },
            other => Err(StoreError::Script(format!(
                "unexpected quota reply {other:?}"
            ))),
        }
    }
}
