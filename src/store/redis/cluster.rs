//! Redis Cluster routing, with health tracked per master.
//!
//! Tollgate keeps its own map of which master serves each hash slot (from
//! `CLUSTER SLOTS`) and one multiplexed connection per worker thread and
//! master, so that:
//!
//! - **a sick master affects only its slots.** Each master has its own
//!   [`Breaker`]: after `breaker_threshold` failures in a row and a
//!   confirming PING that fails too, calls to its slots fail at once (the
//!   limiter answers them from the failure modes) while every other slot is
//!   decided by Redis as before.
//! - **recovery comes with promotion.** While a master's breaker is open the
//!   slot map is read again every `probe_interval`; when a replica has taken
//!   its slots, they go to the new master, whose health is its own.
//! - **a hung node blocks nothing.** The slot map is asked of every known
//!   node and seed at once, and the first answer wins.
//! - **slot migrations are followed.** `MOVED` is followed at once (and the
//!   map read again); `ASK` is followed with `ASKING`; `TRYAGAIN` (a
//!   sliding window's two keys split between the two nodes mid-migration)
//!   is retried after a short pause, within the request's deadline.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::keys::Slot;
use arc_swap::ArcSwap;
use futures_util::future::select_ok;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use super::breaker::Breaker;
use super::conn::redis_error;
use super::script::Invocation;
use super::{NEXT_ID, RedisStore};
use crate::store::StoreError;

/// Hash slots in a Redis Cluster.
const SLOTS: usize = 16_384;
/// No master serves the slot (as far as the last map says).
const UNSERVED: u16 = u16::MAX;
/// Redirections followed for one call before giving up.
const MAX_REDIRECTS: u32 = 5;
/// The slot map is read again at most this often on errors alone.
const REFRESH_EVERY: Duration = Duration::from_millis(50);
/// The longest pause between `TRYAGAIN` retries.
const MAX_TRYAGAIN_PAUSE: Duration = Duration::from_millis(16);

/// One master (or a node a redirection named).
pub(super) struct Node {
    /// Key of its connections in each thread's connection table.
    pub(super) id: usize,
    /// `host:port`.
    pub(super) addr: String,
    /// The seed URL with this node's address: the same scheme, credentials
    /// and TLS.
    pub(super) url: String,
    pub(super) breaker: Breaker,
}

/// Which master serves each slot.
struct Topology {
    /// Per slot, an index into `masters` or [`UNSERVED`].
    owner: Box<[u16]>,
    masters: Vec<Arc<Node>>,
}

impl Topology {
    fn empty() -> Self {
        Self {
            owner: vec![UNSERVED; SLOTS].into_boxed_slice(),
            masters: Vec::new(),
        }
    }

    fn owner(&self, slot: u16) -> Option<&Arc<Node>> {
        self.masters.get(usize::from(self.owner[usize::from(slot)]))
    }

    /// Slots `node` serves.
    fn slots_of(&self, node: &Node) -> usize {
        let Some(index) = self.masters.iter().position(|m| m.id == node.id) else {
            return 0;
        };
        self.owner
            .iter()
            .filter(|&&o| usize::from(o) == index)
            .count()
    }
}

/// A Cluster's slot map and the nodes Tollgate has met.
pub(super) struct Cluster {
    seeds: Vec<String>,
    topology: ArcSwap<Topology>,
    /// Every node met, by address: a node keeps its health (and its
    /// threads' connections) across slot maps.
    nodes: parking_lot::Mutex<HashMap<String, Arc<Node>>>,
    /// Held while the slot map is read; `version` counts the reads done.
    refreshing: tokio::sync::Mutex<()>,
    version: AtomicU64,
    /// When the last read started, in ms since `epoch`.
    last_refresh: AtomicU64,
    epoch: Instant,
}

impl Cluster {
    pub(super) fn new(seeds: Vec<String>) -> Self {
        Self {
            seeds,
            topology: ArcSwap::from_pointee(Topology::empty()),
            nodes: parking_lot::Mutex::new(HashMap::new()),
            refreshing: tokio::sync::Mutex::new(()),
            version: AtomicU64::new(0),
            last_refresh: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// The node at `addr`, met before or new.
    fn node(&self, addr: &str) -> Arc<Node> {
        self.nodes
            .lock()
            .entry(addr.to_owned())
            .or_insert_with(|| {
                Arc::new(Node {
                    id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                    addr: addr.to_owned(),
                    url: node_url(&self.seeds[0], addr),
                    breaker: Breaker::default(),
                })
            })
            .clone()
    }

    /// Masters whose breaker is open.
    pub(super) fn open_masters(&self) -> Vec<String> {
        self.topology
            .load()
            .masters
            .iter()
            .filter(|m| m.breaker.is_open())
            .map(|m| m.addr.clone())
            .collect()
    }

    /// The masters of the current map.
    fn masters(&self) -> Vec<Arc<Node>> {
        self.topology.load().masters.clone()
    }

    /// Installs a slot map read from a node; logs the masters that changed.
    fn install(&self, ranges: &[(u16, u16, String)]) {
        let mut owner = vec![UNSERVED; SLOTS].into_boxed_slice();
        let mut masters: Vec<Arc<Node>> = Vec::new();
        for (start, end, addr) in ranges {
            let index = match masters.iter().position(|m| &m.addr == addr) {
                Some(i) => i,
                None => {
                    masters.push(self.node(addr));
                    masters.len() - 1
                }
            };
            let index = u16::try_from(index).unwrap_or(UNSERVED);
            for slot in *start..=(*end).min(SLOTS as u16 - 1) {
                owner[usize::from(slot)] = index;
            }
        }
        let new = Topology { owner, masters };
        let old = self.topology.swap(Arc::new(new));
        let new = self.topology.load();
        if old.masters.is_empty() {
            tracing::debug!(masters = new.masters.len(), "Redis Cluster slot map read");
            return;
        }
        for slot in 0..SLOTS {
            let (was, is) = (old.owner[slot], new.owner[slot]);
            let was = old.masters.get(usize::from(was)).map(|m| m.addr.as_str());
            let is = new.masters.get(usize::from(is)).map(|m| m.addr.as_str());
            if was != is {
                // Debug: a reshard moves slots many times a second; a master
                // lost and replaced is logged by its breaker (see node_failed).
                tracing::debug!(
                    slot,
                    from = was.unwrap_or("none"),
                    to = is.unwrap_or("none"),
                    "Redis Cluster: hash slots moved (the first one shown)"
                );
                return;
            }
        }
    }
}

/// `seed` with its `host:port` replaced by `addr`.
fn node_url(seed: &str, addr: &str) -> String {
    let (scheme, rest) = seed.split_once("://").unwrap_or(("redis", seed));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority.rfind('@').map_or("", |at| &authority[..=at]);
    format!("{scheme}://{userinfo}{addr}{tail}")
}

/// `host:port`, with brackets around an IPv6 host.
fn address(host: &str, port: i64) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The master ranges of a `CLUSTER SLOTS` reply from `asked` (`host:port`,
/// whose host stands in for an empty or unknown one).
fn parse_slots(reply: &Value, asked: &str) -> Option<Vec<(u16, u16, String)>> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let asked_host = asked.rsplit_once(':').map_or(asked, |(h, _)| h);
    let Value::Array(entries) = reply else {
        return None;
    };
    let mut ranges = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(fields) = entry else {
            return None;
        };
        let [Value::Int(start), Value::Int(end), Value::Array(master), ..] = fields.as_slice()
        else {
            return None;
        };
        let [host, Value::Int(port), ..] = master.as_slice() else {
            return None;
        };
        let host = text(host)?;
        let host = match host.as_str() {
            "" | "?" => asked_host.trim_matches(['[', ']']).to_owned(),
            _ => host,
        };
        ranges.push((
            u16::try_from(*start).ok()?,
            u16::try_from(*end).ok()?,
            address(&host, *port),
        ));
    }
    Some(ranges)
}

/// Counts a failure against a node if the call is dropped before it ends
/// (the request's deadline passed while the node had it).
struct Pending<'a> {
    store: &'a RedisStore,
    node: &'a Arc<Node>,
    done: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            let timeout = self.store.inner.options.timeout;
            self.store
                .node_failed(self.node, &StoreError::Timeout(timeout));
        }
    }
}

impl RedisStore {
    pub(super) fn cluster(&self) -> &Cluster {
        self.inner
            .cluster
            .as_ref()
            .expect("Cluster routing on a Cluster store")
    }

    /// Runs `inv` on the master serving `slot`, following redirections;
    /// the caller bounds it by the request's deadline.
    pub(super) async fn invoke_cluster(
        &self,
        slot: Slot,
        inv: &Invocation<'_>,
    ) -> Result<Value, StoreError> {
        let cluster = self.cluster();
        let mut redirect: Option<(Arc<Node>, bool)> = None;
        let mut redirects = 0;
        let mut pause = Duration::from_millis(1);
        loop {
            let (node, asking) = match redirect.take() {
                Some(to) => to,
                None => (self.owner(slot).await?, false),
            };
            if node.breaker.is_open() {
                // Traffic for its slots reads the map again (at most every
                // 50 ms), so they follow a promotion at once.
                self.refresh_soon();
                return Err(StoreError::CircuitOpen);
            }
            let mut conn = self.node_conn(&node).await?;
            let mut pending = Pending {
                store: self,
                node: &node,
                done: false,
            };
            let reply = inv.run(&mut conn, asking).await;
            pending.done = true;
            let error = match reply {
                Ok(value) => {
                    node.breaker.record_ok();
                    return Ok(value);
                }
                Err(e) => e,
            };
            // `MOVED 3999 :6381` leaves the host out: the same as this node's.
            let redirected = || {
                error
                    .redirect_node()
                    .map(|(addr, _)| match addr.strip_prefix(':') {
                        Some(port) => {
                            let host = node.addr.rsplit_once(':').map_or("", |(h, _)| h);
                            cluster.node(&format!("{host}:{port}"))
                        }
                        None => cluster.node(addr),
                    })
            };
            match error.kind() {
                ErrorKind::Server(ServerErrorKind::Moved) if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    self.refresh_soon();
                    redirect = redirected().map(|n| (n, false));
                }
                ErrorKind::Server(ServerErrorKind::Ask) if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    redirect = redirected().map(|n| (n, true));
                }
                // Mid-migration (the keys split between the two nodes), or
                // a master just demoted or not yet in charge: pause, then
                // ask the slot's master (by the map) again. The caller's
                // deadline ends this.
                ErrorKind::Server(
                    ServerErrorKind::TryAgain
                    | ServerErrorKind::ReadOnly
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ClusterDown,
                ) => {
                    if !matches!(error.kind(), ErrorKind::Server(ServerErrorKind::TryAgain)) {
                        self.refresh_soon();
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_TRYAGAIN_PAUSE);
                }
                _ => {
                    let failure = redis_error(&error);
                    if failure.is_transient() {
                        self.node_failed(&node, &failure);
                        self.refresh_soon();
                    }
                    return Err(failure);
                }
            }
        }
    }

    /// Whether calls for `slot` stop at a breaker: the store's, or on a
    /// Cluster, that of the master serving it.
    pub(super) fn slot_open(&self, slot: Slot) -> bool {
        self.inner.breaker.is_open()
            || self.inner.cluster.as_ref().is_some_and(|c| {
                c.topology
                    .load()
                    .owner(slot)
                    .is_some_and(|n| n.breaker.is_open())
            })
    }

    /// The master serving `slot`; the map is read first if there is none.
    async fn owner(&self, slot: u16) -> Result<Arc<Node>, StoreError> {
        let cluster = self.cluster();
        if let Some(node) = cluster.topology.load().owner(slot) {
            return Ok(node.clone());
        }
        let version = cluster.version.load(Ordering::Acquire);
        if cluster.topology.load().masters.is_empty() {
            // Type-erased: connecting to every node is a deep future, and
            // every request's future would carry its type.
            let refresh: futures_util::future::BoxFuture<'_, _> = Box::pin(self.refresh(version));
            refresh.await?;
            if let Some(node) = cluster.topology.load().owner(slot) {
                return Ok(node.clone());
            }
        } else {
            self.refresh_soon();
        }
        Err(StoreError::Redis {
            message: format!("no Redis Cluster master serves hash slot {slot}"),
            transient: true,
        })
    }

    /// Reads the slot map in the background, unless a read is under way or
    /// one started within [`REFRESH_EVERY`].
    fn refresh_soon(&self) {
        let cluster = self.cluster();
        let now = cluster.epoch.elapsed().as_millis() as u64;
        let last = cluster.last_refresh.load(Ordering::Relaxed);
        if now.saturating_sub(last) < REFRESH_EVERY.as_millis() as u64
            || cluster
                .last_refresh
                .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let store = self.clone();
        let version = cluster.version.load(Ordering::Acquire);
        tokio::spawn(async move {
            if let Err(error) = store.refresh(version).await {
                tracing::debug!(%error, "Redis Cluster slot map not read");
            }
        });
    }

    /// Reads the slot map, asking every known node and seed at once (the
    /// first answer wins, so hung nodes do not hold it up), unless a read
    /// finished since `version` was seen.
    pub(super) async fn refresh(&self, version: u64) -> Result<(), StoreError> {
        let cluster = self.cluster();
        let _one = cluster.refreshing.lock().await;
        if cluster.version.load(Ordering::Acquire) != version {
            return Ok(());
        }
        cluster.last_refresh.store(
            (cluster.epoch.elapsed().as_millis() as u64).max(1),
            Ordering::Relaxed,
        );
        let mut urls: Vec<(String, String)> = Vec::new();
        let masters = cluster.masters();
        // Healthy masters first, then the seeds, then the rest met so far.
        let known: Vec<Arc<Node>> = cluster.nodes.lock().values().cloned().collect();
        let healthy = masters.iter().filter(|m| !m.breaker.is_open());
        for node in healthy.chain(known.iter()) {
            urls.push((node.addr.clone(), node.url.clone()));
        }
        for seed in &cluster.seeds {
            urls.push((seed_addr(seed), seed.clone()));
        }
        let mut seen = std::collections::HashSet::new();
        urls.retain(|(addr, _)| seen.insert(addr.clone()));
        let within = self.probe_within();
        let asks = urls.iter().map(|(addr, url)| {
            Box::pin(async move {
                let reply = tokio::time::timeout(within, self.cluster_slots(url, within))
                    .await
                    .map_err(|_| format!("{}: no answer within {within:?}", super::redact(url)))?
                    .map_err(|e| format!("{}: {e}", super::redact(url)))?;
                parse_slots(&reply, addr)
                    .filter(|ranges| !ranges.is_empty())
                    .ok_or_else(|| {
                        format!("{}: unexpected CLUSTER SLOTS reply", super::redact(url))
                    })
            })
        });
        match select_ok(asks).await {
            Ok((ranges, _)) => {
                cluster.install(&ranges);
                cluster.version.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Err(last) => Err(StoreError::Redis {
                message: format!("no Redis Cluster node gave the slot map (the last: {last})"),
                transient: true,
            }),
        }
    }

    /// `CLUSTER SLOTS` from the node at `url`, on a connection of its own.
    async fn cluster_slots(&self, url: &str, within: Duration) -> Result<Value, RedisError> {
        let mut conn = self.fresh_connection(url, within).await?;
        redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await
    }

    /// PING to one node on a connection of its own, within the probe timeout.
    async fn probe_node(&self, node: &Node) -> Result<(), StoreError> {
        let within = self.probe_within();
        let ping = async {
            let mut conn = self.fresh_connection(&node.url, within).await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        match tokio::time::timeout(within, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(redis_error(&e)),
            Err(_) => Err(StoreError::Timeout(within)),
        }
    }

    /// Every master of the map answers PING (the map is read first): what
    /// readiness asks. The error names the masters that do not.
    pub(super) async fn ping_cluster(&self) -> Result<(), StoreError> {
        let cluster = self.cluster();
        self.refresh(cluster.version.load(Ordering::Acquire))
            .await?;
        let masters = cluster.masters();
        let pings = masters.iter().map(|m| async move {
            match self.probe_node(m).await {
                Ok(()) => None,
                Err(e @ StoreError::Config(_)) => Some((m.addr.clone(), e, true)),
                Err(e) => Some((m.addr.clone(), e, false)),
            }
        });
        let failing: Vec<_> = futures_util::future::join_all(pings)
            .await
            .into_iter()
            .flatten()
            .collect();
        if let Some((_, e, true)) = failing.iter().find(|(_, _, config)| *config) {
            return Err(e.clone());
        }
        if failing.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = failing
            .iter()
            .map(|(addr, e, _)| format!("{addr}: {e}"))
            .collect();
        Err(StoreError::Redis {
            message: format!(
                "{} of {} Redis Cluster masters do not answer ({}); their slots are answered from failure modes",
                failing.len(),
                masters.len(),
                names.join("; ")
            ),
            transient: true,
        })
    }

    /// Counts a transient failure of `node`. At the threshold the node is
    /// asked a PING on a fresh connection; only a node that fails it too
    /// has its breaker opened, and then only its slots are answered from
    /// failure modes, until it answers again or its slots move.
    pub(super) fn node_failed(&self, node: &Arc<Node>, error: &StoreError) {
        if !node
            .breaker
            .record_failure(self.inner.options.breaker_threshold)
        {
            return;
        }
        let store = self.clone();
        let node = node.clone();
        let error = error.clone();
        tokio::spawn(async move {
            let answers = store.probe_node(&node).await.is_ok();
            node.breaker.confirmed(!answers);
            if answers {
                tracing::debug!(node = %node.addr, %error, "Redis Cluster calls failed but the node answers PING; its circuit stays closed");
                return;
            }
            let cluster = store.cluster();
            let slots = cluster.topology.load().slots_of(&node);
            tracing::error!(
                node = %node.addr,
                slots,
                %error,
                "Redis Cluster master unavailable: its hash slots are answered from failure modes; the other masters' are decided as before"
            );
            // Two ways back, watched at once: the node answers a probe
            // (each may wait the probe timeout on a hung node), or the slot
            // map, read every probe interval, no longer gives it slots.
            let interval = store.inner.options.probe_interval;
            let answers = async {
                let mut probes = 0u64;
                loop {
                    tokio::time::sleep(interval).await;
                    probes += 1;
                    if store.probe_node(&node).await.is_ok() {
                        return probes;
                    }
                }
            };
            let moved = async {
                loop {
                    tokio::time::sleep(interval).await;
                    let version = cluster.version.load(Ordering::Acquire);
                    let _ = store.refresh(version).await;
                    if cluster.topology.load().slots_of(&node) == 0 {
                        return;
                    }
                }
            };
            tokio::select! {
                probes = answers => {
                    node.breaker.close();
                    tracing::info!(
                        node = %node.addr,
                        probes,
                        "Redis Cluster master is back: deciding its slots through Redis again"
                    );
                }
                () = moved => {
                    node.breaker.close();
                    tracing::info!(
                        node = %node.addr,
                        "Redis Cluster: the unavailable master's slots moved to other masters (a replica was promoted); deciding them there"
                    );
                }
            }
        });
    }
}

/// The `host:port` of a seed URL.
fn seed_addr(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, a)| a)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_url_keeps_the_seeds_scheme_credentials_and_options() {
        assert_eq!(
            node_url(
                "rediss://u:p%40ss@seed:7000/0?protocol=resp3#insecure",
                "10.0.0.9:7001"
            ),
            "rediss://u:p%40ss@10.0.0.9:7001/0?protocol=resp3#insecure"
        );
        assert_eq!(
            node_url("redis://seed:7000", "[::1]:7002"),
            "redis://[::1]:7002"
        );
        assert_eq!(seed_addr("redis://:pw@seed:7000/0"), "seed:7000");
    }

    #[test]
    fn the_slot_map_takes_masters_and_fills_unknown_hosts_from_the_asked_node() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("10.0.0.1"), Value::Int(7000), bulk("id1")]),
                Value::Array(vec![bulk("10.0.0.4"), Value::Int(7003), bulk("id4")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![bulk(""), Value::Int(7001), bulk("id2")]),
            ]),
        ]);
        assert_eq!(
            parse_slots(&reply, "10.0.0.2:7001").expect("a map"),
            vec![
                (0, 5460, "10.0.0.1:7000".to_owned()),
                (5461, 16383, "10.0.0.2:7001".to_owned())
            ]
        );
        assert_eq!(parse_slots(&Value::Int(1), "x:1"), None);
    }

    #[test]
    fn a_new_map_keeps_each_nodes_health_and_serves_slots_by_it() {
        let cluster = Cluster::new(vec!["redis://a:1".into()]);
        cluster.install(&[(0, 100, "a:1".into()), (101, 16383, "b:2".into())]);
        let b = cluster.topology.load().owner(200).expect("served").clone();
        assert_eq!(b.addr, "b:2");
        assert_eq!(cluster.topology.load().slots_of(&b), 16383 - 100);
        // b's replica c takes its slots: b serves none, and keeps its id.
        cluster.install(&[(0, 100, "a:1".into()), (101, 16383, "c:3".into())]);
        let topology = cluster.topology.load();
        assert_eq!(topology.slots_of(&b), 0);
        assert_eq!(topology.owner(200).expect("served").addr, "c:3");
        assert_eq!(cluster.node("b:2").id, b.id);
        assert!(topology.owner(0).is_some());
    }
}
