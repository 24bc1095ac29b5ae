//! The rate limit quota (RLQS) exchange: each instance reports its clients'
//! weight and what it admitted, and learns everyone's (see `quota.lua`).

use futures_util::StreamExt;
use redis::Value;

use super::keys::quota_key_names;
use super::options::RedisOptions;
use super::route::Route;
use super::script::{Lua, Script};
use super::server::Server;
use crate::algorithm::NANOS_PER_TICK;
use crate::calendar::Window;
use crate::clock::Nanos;
use crate::store::StoreError;

/// One instance's report for a quota bucket: see [`crate::store::QuotaShare`].
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

/// Buckets in one exchange call: one call per Cluster slot, and at most
/// this many buckets in it (a call's run time on Redis stays short).
const EXCHANGE_CHUNK: usize = 256;

/// Exchange calls in flight at once.
const EXCHANGE_CONCURRENCY: usize = 16;

/// The most weight one instance reports for a bucket, in millionths of a
/// request per second (a billion requests per second): sums of many stay
/// exact in Lua's doubles.
const MAX_WEIGHT_MILLIONTHS: f64 = 1e15;

/// The exchange of totals between instances, in the shared Redis; cheap
/// to clone.
#[derive(Clone)]
pub(super) struct Quotas {
    route: Route,
    script: Lua,
    prefix: String,
}

impl Quotas {
    pub(super) fn new(route: Route, options: &RedisOptions) -> Self {
        Self {
            route,
            script: Lua::of(Script::Quota),
            prefix: options.prefix.clone(),
        }
    }

    /// The exchange of one Tollgate instance for many rate limit quota
    /// (RLQS) buckets (see `quota.lua`): for each, records this instance's
    /// weight and what it admitted in the window, and answers the weight of
    /// every instance heard from within `stale`, and what all of them
    /// admitted in the window. The buckets of one Cluster slot go in one
    /// call (at most 256); every call together has `within`.
    /// The answers are in the order of `exchanges`.
    pub(super) async fn exchange(
        &self,
        exchanges: &[QuotaExchange<'_>],
        within: std::time::Duration,
    ) -> Vec<Result<QuotaTotals, StoreError>> {
        let mut results: Vec<Result<QuotaTotals, StoreError>> = exchanges
            .iter()
            .map(|_| Err(StoreError::Timeout(within)))
            .collect();
        if exchanges.is_empty() {
            return results;
        }
        if self.route.stopped() {
            return exchanges
                .iter()
                .map(|_| Err(StoreError::CircuitOpen))
                .collect();
        }
        // Group by slot (Cluster); elsewhere any keys may share a call.
        let clustered = self.route.clustered();
        let mut groups: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        let mut keys = Vec::with_capacity(exchanges.len());
        for (i, exchange) in exchanges.iter().enumerate() {
            let names = quota_key_names(
                &self.prefix,
                exchange.domain,
                exchange.entries,
                exchange.window.index,
            );
            let slot = if clustered {
                super::keys::slot_of(names[0].as_bytes())
            } else {
                0
            };
            groups.entry(slot).or_default().push(i);
            keys.push(names);
        }
        let calls: Vec<Vec<usize>> = groups
            .into_values()
            .flat_map(|members| {
                members
                    .chunks(EXCHANGE_CHUNK)
                    .map(<[usize]>::to_vec)
                    .collect::<Vec<_>>()
            })
            .collect();
        let keys = &keys;
        let mut replies = futures_util::stream::iter(calls.into_iter().map(|members| async move {
            let reply = self.exchange_call(exchanges, keys, &members).await;
            (members, reply)
        }))
        .buffer_unordered(EXCHANGE_CONCURRENCY);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, replies.next()).await {
                Ok(Some((members, Ok(totals)))) => {
                    for (i, totals) in members.into_iter().zip(totals) {
                        results[i] = Ok(totals);
                    }
                }
                Ok(Some((members, Err(e)))) => {
                    for i in members {
                        results[i] = Err(e.clone());
                    }
                }
                // Done, or out of time: what has not answered stays a
                // timeout.
                Ok(None) | Err(_) => break,
            }
        }
        results
    }

    /// One call of the exchange: the buckets `members` of `exchanges`.
    async fn exchange_call(
        &self,
        exchanges: &[QuotaExchange<'_>],
        keys: &[[String; 2]],
        members: &[usize],
    ) -> Result<Vec<QuotaTotals>, StoreError> {
        let Some(first) = members.first().map(|&i| &exchanges[i]) else {
            return Ok(Vec::new());
        };
        let now_us = first.now / NANOS_PER_TICK;
        let mut invocation = self.script.prepare_invoke();
        for &i in members {
            invocation.key(&keys[i][0]).key(&keys[i][1]);
        }
        invocation
            .arg(first.instance)
            .arg(now_us)
            .arg(first.stale / NANOS_PER_TICK);
        for &i in members {
            let exchange = &exchanges[i];
            // The window's counter lives until the window ends, and a little
            // longer for instances whose clocks run behind.
            let ttl_ms = exchange.window.end.saturating_sub(now_us) / 1000 + 60_000;
            let weight = (exchange.weight.max(0.0) * 1e6).min(MAX_WEIGHT_MILLIONTHS) as u64;
            // Counts past the limit change nothing; the bound keeps the
            // window's INCRBY far from overflowing whatever a client says.
            let admitted = exchange.admitted.min(u64::from(u32::MAX));
            invocation.arg(weight).arg(admitted).arg(ttl_ms.max(1));
        }
        let reply = self.route.invoke(invocation.slot(), &invocation).await?;
        let unexpected = || StoreError::Script(format!("unexpected quota reply {reply:?}"));
        let Value::Array(items) = &reply else {
            return Err(unexpected());
        };
        if items.len() != members.len() * 2 {
            return Err(unexpected());
        }
        items
            .chunks(2)
            .map(|pair| match pair {
                [Value::Int(total), Value::Int(used)] => Ok(QuotaTotals {
                    weight: *total as f64 / 1e6,
                    used: (*used).max(0) as u64,
                }),
                _ => Err(unexpected()),
            })
            .collect()
    }
}
