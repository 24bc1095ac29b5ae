//! Redis and Redis Cluster: one Lua script call per request (per hash slot in
//! Cluster), deciding every check of the request together.
//!
//! **Time** comes from the caller (Tollgate's clock), not from Redis `TIME`:
//! key names carry the window number, and Redis Cluster routes a script by
//! the keys declared before it runs, so the caller must know the window. The
//! price is that instances' clocks must agree (NTP keeps them within
//! milliseconds, small against windows of a second or more).
//!
//! **Connections** are the `redis` crate's multiplexed async connections, one
//! per worker thread (made on first use, on that thread's runtime), so the
//! calls of concurrent requests on a worker are pipelined on one connection
//! with no cross-thread hops. They reconnect by themselves.
//!
//! **Failure**: every request has a deadline, `timeout` from when it asks
//! (see coalesce.rs for how queued requests keep it). After `breaker_threshold` failures in
//! a row the store stops calling Redis (each decision fails at once, and the
//! limiter answers from the failure modes) and probes Redis in the background
//! until it answers. The outage and the recovery are logged once each.

mod coalesce;
mod conn;
mod keys;
mod lease;
mod msgpack;
mod options;
mod over_limit;
mod per_second;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use futures_util::future::join_all;
use redis::{Script, Value};
use smallvec::SmallVec;

use super::{Check, StoreError, refused};
use crate::algorithm::{Algorithm, NANOS_PER_TICK, Outcome};
use crate::calendar::Window;
use crate::clock::Nanos;
pub use coalesce::BatchBounds;
use coalesce::{CheckArgs, Part};
use conn::redis_error;
use keys::{key_names, quota_key_names, script_code};
use options::config_error;
pub use options::{RedisOptions, RedisTarget, redact, url_prefix, userinfo_escape};
pub use over_limit::OverLimitCache;
use redis::cluster_routing::Slot;

const ALGORITHMS: &str = concat!(
    "local ALGORITHMS = {}\n",
    include_str!("fixed_window.lua"),
    include_str!("sliding_window.lua"),
    include_str!("token_bucket.lua"),
);

/// The script sent to Redis: the three algorithms, then the batch driver.
fn batch_script() -> Script {
    Script::new(&format!("{ALGORITHMS}{}", include_str!("batch.lua")))
}

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

struct Inner {
    id: usize,
    options: RedisOptions,
    batch: Script,
    refund: Script,
    quota: Script,
    failures: AtomicU32,
    open: AtomicBool,
    /// A PING is checking whether failing calls mean Redis is down.
    confirming: AtomicBool,
    /// Bumped after an outage so that threads drop their old connections.
    generation: AtomicUsize,
    over_limit: Option<OverLimitCache>,
    /// Local balances of leased keys (`consistency: leased`).
    leases: lease::Leases,
    /// Behind Sentinel: the master's address last seen, and whether the
    /// task that watches for it moving runs.
    sentinel_master: parking_lot::Mutex<Option<String>>,
    sentinel_watch: AtomicBool,
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
            .field("circuit_open", &self.inner.open.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// One hash slot's share of a request.
struct Group {
    checks: SmallVec<[usize; 4]>,
    /// The checks' keys, in order; shared with the script call's [`Part`].
    keys: Arc<[String]>,
    /// Each check's window, in ticks (the scripts take the caller's windows).
    windows: SmallVec<[Window; 4]>,
    /// Every enforced quota-mode check of the request is in this group, so
    /// the script can apply the quota-mode rule itself.
    quota_here: bool,
}

impl Group {
    /// Whether the script refused (and so committed nothing) for this group.
    fn refused_here(&self, checks: &[Check]) -> bool {
        let mine = self.checks.iter().map(|&i| &checks[i]);
        if self.quota_here {
            refused(mine)
        } else {
            refused(mine.filter(|c| !c.quota_mode))
        }
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
        Ok(Self {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                over_limit: options.over_limit_cache.then(OverLimitCache::default),
                options,
                batch: batch_script(),
                refund: Script::new(include_str!("refund.lua")),
                quota: Script::new(include_str!("quota.lua")),
                failures: AtomicU32::new(0),
                open: AtomicBool::new(false),
                confirming: AtomicBool::new(false),
                generation: AtomicUsize::new(0),
                leases: lease::Leases::default(),
                sentinel_master: parking_lot::Mutex::new(None),
                sentinel_watch: AtomicBool::new(false),
                per_second,
            }),
        })
    }

    /// Whether the circuit is open (Redis considered down).
    pub fn circuit_open(&self) -> bool {
        self.inner.open.load(Ordering::Relaxed)
    }

    /// One Tollgate instance's exchange for a rate limit quota (RLQS) bucket
    /// (see `quota.lua`): records `instance`'s weight and `admitted` in
    /// `window`, and answers the weight of every instance heard from within
    /// `stale`, and what all of them admitted in the window.
    pub async fn exchange_quota(
        &self,
        exchange: &QuotaExchange<'_>,
    ) -> Result<QuotaTotals, StoreError> {
        if self.circuit_open() {
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
        let mut conn = self.conn().await?;
        let reply = self.timed(conn.invoke(&invocation)).await?;
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
        if self.circuit_open() {
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
                self.inner.failures.store(0, Ordering::Relaxed);
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
                if e.is_transient() {
                    self.failed(&e);
                    // Behind Sentinel, a failing master may have been
                    // replaced (a demoted one answers READONLY): every
                    // worker asks the sentinels again on its next call.
                    if matches!(self.inner.options.target, RedisTarget::Sentinel { .. }) {
                        self.inner.generation.fetch_add(1, Ordering::AcqRel);
                    }
                }
                Err(e)
            }
        }
    }

    /// Counts a transient failure. At the threshold, Redis is asked a fresh
    /// PING before the circuit opens: calls can time out while Redis is up
    /// (a burst of heavy requests from one client, say), and opening the
    /// circuit then would hand everyone the failure modes. Only a Redis that
    /// also fails the PING is treated as down.
    fn failed(&self, error: &StoreError) {
        let failures = self.inner.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < self.inner.options.breaker_threshold
            || self.inner.open.load(Ordering::Acquire)
            || self.inner.confirming.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let store = self.clone();
        let error = error.clone();
        tokio::spawn(async move {
            let answers = store.probe().await.is_ok();
            store.inner.failures.store(0, Ordering::Relaxed);
            if answers {
                store.inner.confirming.store(false, Ordering::Release);
                tracing::debug!(%error, "Redis calls failed but Redis answers PING; the circuit stays closed");
                return;
            }
            store.inner.open.store(true, Ordering::Release);
            store.inner.confirming.store(false, Ordering::Release);
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
                    store.inner.generation.fetch_add(1, Ordering::AcqRel);
                    store.inner.failures.store(0, Ordering::Relaxed);
                    store.inner.open.store(false, Ordering::Release);
                    tracing::info!(
                        probes = attempts,
                        "Redis is back: deciding through Redis again"
                    );
                    return;
                }
            }
        });
    }

    async fn call(
        &self,
        checks: &mut [Check],
        now: Nanos,
        deadline: tokio::time::Instant,
    ) -> Result<SmallVec<[(Slot, Group); 2]>, StoreError> {
        let cluster = matches!(self.inner.options.target, RedisTarget::Cluster(_));
        let mut groups: SmallVec<[(Slot, Group); 2]> = SmallVec::new();
        let mut names_of: SmallVec<[SmallVec<[String; 4]>; 2]> = SmallVec::new();
        for (i, check) in checks.iter().enumerate() {
            let window = check.quota.window_at(now);
            let (names, n) = key_names(&self.inner.options.prefix, &check.key, window.index);
            let slot = if cluster {
                Slot::for_key(&names[0])
            } else {
                Slot::for_key("")
            };
            let g = match groups.iter().position(|(s, _)| *s == slot) {
                Some(g) => g,
                None => {
                    groups.push((
                        slot,
                        Group {
                            checks: SmallVec::new(),
                            keys: Arc::new([]),
                            windows: SmallVec::new(),
                            quota_here: false,
                        },
                    ));
                    names_of.push(SmallVec::new());
                    groups.len() - 1
                }
            };
            groups[g].1.checks.push(i);
            groups[g].1.windows.push(window);
            names_of[g].extend(names.into_iter().take(n));
        }
        for ((_, group), names) in groups.iter_mut().zip(names_of) {
            group.keys = names.into_iter().collect();
        }
        let is_quota = |c: &Check| c.enforced && c.quota_mode;
        let quota = checks.iter().filter(|c| is_quota(c)).count();
        for (_, group) in &mut groups {
            // Linear: a group holds them all when it holds as many as there are.
            let here = group
                .checks
                .iter()
                .filter(|&&i| is_quota(&checks[i]))
                .count();
            group.quota_here = here == quota;
        }
        let fill = |checks: &mut [Check], group: &Group, rows: coalesce::Rows| {
            for (&i, (allowed, remaining, wait_us)) in group.checks.iter().zip(rows) {
                checks[i].outcome = Some(Outcome {
                    allowed,
                    remaining,
                    wait: wait_us.saturating_mul(NANOS_PER_TICK),
                    commit: None,
                });
            }
        };
        if let [(slot, group)] = groups.as_slice() {
            // One slot (always, on a standalone Redis): no futures to gather.
            let rows = self
                .decide_part(*slot, self.part(group, checks, now, true), deadline)
                .await?;
            fill(checks, group, rows);
            return Ok(groups);
        }
        let calls = groups.iter().map(|(slot, group)| {
            self.decide_part(*slot, self.part(group, checks, now, true), deadline)
        });
        let replies = join_all(calls).await;
        for ((_, group), rows) in groups.iter().zip(replies) {
            fill(checks, group, rows?);
        }
        Ok(groups)
    }

    /// One slot's checks of a request, as the batch script takes them;
    /// `spend: false` asks each check with zero hits (what is left,
    /// spending nothing).
    fn part(&self, group: &Group, checks: &[Check], now: Nanos, spend: bool) -> Part {
        let args = group.checks.iter().zip(&group.windows).map(|(&i, window)| {
            let c = &checks[i];
            let (a, b) = match c.algorithm {
                Algorithm::TokenBucket => (
                    (c.quota.period / NANOS_PER_TICK).max(1),
                    u64::from(c.quota.burst.max(1)),
                ),
                _ => (window.start, window.end),
            };
            let hits = c.quota.hits(if spend { c.hits } else { 0 });
            let enforce = match (c.enforced, c.quota_mode) {
                (false, _) => b'0',
                (true, false) => b'1',
                (true, true) if group.quota_here => b'q',
                (true, true) => b'Q',
            };
            CheckArgs {
                code: script_code(c.algorithm).as_bytes()[0],
                limit: c.quota.limit,
                a,
                b,
                cost: hits.cost,
                charge: hits.charge,
                enforce,
            }
        });
        Part {
            keys: group.keys.clone(),
            now_us: now / NANOS_PER_TICK,
            checks: args.collect(),
        }
    }

    /// Across hash slots each script call is all or nothing on its own; when
    /// one slot refused the request, the hits the others committed are given
    /// back, so the request as a whole spends nothing. The refusal stands
    /// whatever happens here; a refund that fails leaves those hits spent, so
    /// the error is only ever on the side of refusing, and it is logged.
    async fn keep_all_or_nothing(
        &self,
        checks: &mut [Check],
        groups: &[(Slot, Group)],
        now: Nanos,
    ) {
        let ro: &[Check] = checks;
        // A group refused on its own (and wrote nothing) only when the whole
        // request is refused (see `Group::quota_here`), so nothing needs
        // undoing unless the request is refused.
        if !refused(ro.iter()) {
            return;
        }
        let conn = match self.conn().await {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "refund across Cluster slots not sent; the refused request's hits stay spent");
                return;
            }
        };
        let refunds = groups
            .iter()
            .filter(|(_, g)| !g.refused_here(ro))
            .map(|(_, group)| {
                let mut inv = self.inner.refund.prepare_invoke();
                let mut k = 0;
                for &i in &group.checks {
                    let c = &ro[i];
                    let n = if c.algorithm == Algorithm::SlidingWindow {
                        2
                    } else {
                        1
                    };
                    for key in &group.keys[k..k + n] {
                        inv.key(key);
                    }
                    k += n;
                    let committed = if c.outcome.is_some_and(|o| o.allowed) {
                        c.charge()
                    } else {
                        0
                    };
                    let period = (c.quota.period / NANOS_PER_TICK).max(1);
                    let interval = period / u64::from(c.quota.limit.max(1));
                    inv.arg(script_code(c.algorithm))
                        .arg(committed)
                        .arg(interval.max(1));
                }
                let mut conn = conn.clone();
                async move { conn.invoke(&inv).await.map_err(|e| redis_error(&e)) }
            });
        let timeout = self.inner.options.timeout;
        let refunded = tokio::time::timeout(timeout, join_all(refunds)).await;
        let failed = match refunded {
            Err(_) => Some(StoreError::Timeout(timeout)),
            Ok(results) => results.into_iter().find_map(Result::err),
        };
        if let Some(error) = failed {
            tracing::warn!(%error, "refund across Cluster slots failed; the refused request's hits stay spent");
            return;
        }
        // As on one slot (and in memory), the admitted checks of a refused
        // request report what is left without it: read once more, spending
        // nothing, now that the refund is in.
        let deadline = tokio::time::Instant::now() + timeout;
        let rereads =
            groups
                .iter()
                .filter(|(_, g)| !g.refused_here(ro))
                .map(|(slot, group)| async move {
                    let rows = self
                        .decide_part(*slot, self.part(group, ro, now, false), deadline)
                        .await?;
                    Ok::<_, StoreError>((group, rows))
                });
        let Ok(rereads) = tokio::time::timeout_at(deadline, join_all(rereads)).await else {
            return;
        };
        for (group, rows) in rereads.into_iter().flatten() {
            for (&i, (_, left, _)) in group.checks.iter().zip(rows) {
                if let Some(outcome) = checks[i].outcome.as_mut().filter(|o| o.allowed) {
                    outcome.remaining = left;
                }
            }
        }
    }
}

fn parse_reply(value: Value, expected: usize) -> Result<Vec<(bool, u32, u64)>, StoreError> {
    let bad = || StoreError::Script(format!("unexpected reply from the batch script: {value:?}"));
    let Value::BulkString(bytes) = &value else {
        return Err(bad());
    };
    let numbers = msgpack::read_numbers(bytes).ok_or_else(bad)?;
    if numbers.len() != expected * 3 {
        return Err(bad());
    }
    Ok(numbers
        .chunks_exact(3)
        .map(|row| {
            (
                row[0] == 1,
                u32::try_from(row[1]).unwrap_or(if row[1] < 0 { 0 } else { u32::MAX }),
                u64::try_from(row[2]).unwrap_or(0),
            )
        })
        .collect())
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
