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
//!   map read again); `ASK` is followed with `ASKING`. A decision whose keys
//!   are not all on one of the two nodes (Redis answers `TRYAGAIN`: a new
//!   key, a call's receipt, a sliding window's two windows split) is made
//!   key by key (`migration.rs`), so a migrating slot of any size is still
//!   decided by Redis; other scripts are retried after a short pause,
//!   within the caller's deadline.

mod map;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_ok;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use map::{Map, Node, parse_slots, seed_addr};

use super::conn::{Conn, Connections};
use super::error::redis_error;
use super::events::Events;
use super::keys::Slot;
use super::options::{RedisOptions, redact};
use super::script::Invocation;
use super::server::Server;
use crate::store::StoreError;

/// Redirections followed for one call before giving up.
const MAX_REDIRECTS: u32 = 5;
/// The slot map is read again at most this often on errors alone.
const REFRESH_EVERY: Duration = Duration::from_millis(50);
/// The longest pause between `TRYAGAIN` retries.
const MAX_TRYAGAIN_PAUSE: Duration = Duration::from_millis(16);

/// A Redis Cluster: its slot map and nodes, the connections to them, and
/// each master's health.
pub(super) struct Cluster {
    map: Map,
    connections: Connections,
    /// Confirming PINGs, for `/metrics` (shared with the store's other
    /// layers).
    events: Arc<Events>,
    timeout: Duration,
    probe_interval: Duration,
    breaker_threshold: u32,
}

/// Counts a failure against a node if the call is dropped before it ends
/// (the request's deadline passed while the node had it).
struct Pending<'a> {
    cluster: &'a Arc<Cluster>,
    node: &'a Arc<Node>,
    done: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.done {
            let timeout = self.cluster.timeout;
            self.cluster
                .node_failed(self.node, &StoreError::Timeout(timeout));
        }
    }
}

impl Cluster {
    /// A Cluster reached through `seeds`; the map is read on first use.
    pub(super) fn new(seeds: Vec<String>, options: &RedisOptions, events: Arc<Events>) -> Self {
        Self {
            map: Map::new(seeds),
            connections: Connections::new(options),
            events,
            timeout: options.timeout,
            probe_interval: options.probe_interval,
            breaker_threshold: options.breaker_threshold,
        }
    }

    async fn connection_to(&self, node: &Node) -> Result<Conn, StoreError> {
        self.connections
            .shared_to(node.id, node.breaker.generation(), &node.url)
            .await
    }

    /// The master serving `slot`; the map is read first if there is none.
    async fn owner(self: &Arc<Self>, slot: u16) -> Result<Arc<Node>, StoreError> {
        if let Some(node) = self.map.owner(slot) {
            return Ok(node);
        }
        let version = self.map.version();
        if self.map.is_empty() {
            // Type-erased: connecting to every node is a deep future, and
            // every request's future would carry its type.
            let refresh: futures_util::future::BoxFuture<'_, _> = Box::pin(self.refresh(version));
            refresh.await?;
            if let Some(node) = self.map.owner(slot) {
                return Ok(node);
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
    fn refresh_soon(self: &Arc<Self>) {
        if !self.map.refresh_due(REFRESH_EVERY) {
            return;
        }
        let cluster = self.clone();
        let version = self.map.version();
        tokio::spawn(async move {
            if let Err(error) = cluster.refresh(version).await {
                tracing::debug!(%error, "Redis Cluster slot map not read");
            }
        });
    }

    /// Reads the slot map, asking every known node and seed at once (the
    /// first answer wins, so hung nodes do not hold it up), unless a read
    /// finished since `version` was seen.
    async fn refresh(&self, version: u64) -> Result<(), StoreError> {
        let Some(_one) = self.map.start_refresh(version).await else {
            return Ok(());
        };
        let mut urls: Vec<(String, String)> = Vec::new();
        let masters = self.map.masters();
        // Healthy masters first, then the seeds, then the rest met so far.
        let known = self.map.known();
        let healthy = masters.iter().filter(|m| !m.breaker.is_open());
        for node in healthy.chain(known.iter()) {
            urls.push((node.addr.clone(), node.url.clone()));
        }
        for seed in self.map.seeds() {
            urls.push((seed_addr(seed), seed.clone()));
        }
        let mut seen = std::collections::HashSet::new();
        urls.retain(|(addr, _)| seen.insert(addr.clone()));
        let within = self.connections.probe_within();
        let asks = urls.iter().map(|(addr, url)| {
            Box::pin(async move {
                let reply = tokio::time::timeout(within, self.cluster_slots(url, within))
                    .await
                    .map_err(|_| format!("{}: no answer within {within:?}", redact(url)))?
                    .map_err(|e| format!("{}: {e}", redact(url)))?;
                parse_slots(&reply, addr)
                    .filter(|ranges| !ranges.is_empty())
                    .ok_or_else(|| format!("{}: unexpected CLUSTER SLOTS reply", redact(url)))
            })
        });
        match select_ok(asks).await {
            Ok((ranges, _)) => {
                self.map.install(&ranges);
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
        let mut conn = self.connections.fresh_to(url, within).await?;
        redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await
    }

    /// PING to one node on a connection of its own, within the probe timeout.
    async fn probe_node(&self, node: &Node) -> Result<(), StoreError> {
        let within = self.connections.probe_within();
        let ping = async {
            let mut conn = self.connections.fresh_to(&node.url, within).await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await
        };
        match tokio::time::timeout(within, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(redis_error(&e)),
            Err(_) => Err(StoreError::Timeout(within)),
        }
    }

    /// Counts a transient failure of `node`. At the threshold the node is
    /// asked a PING on a fresh connection; only a node that fails it too
    /// has its breaker opened, and then only its slots are answered from
    /// failure modes, until it answers again or its slots move.
    fn node_failed(self: &Arc<Self>, node: &Arc<Node>, error: &StoreError) {
        if !node.breaker.record_failure(self.breaker_threshold) {
            return;
        }
        let cluster = self.clone();
        let node = node.clone();
        let error = error.clone();
        tokio::spawn(async move {
            let answers = cluster.probe_node(&node).await.is_ok();
            node.breaker.confirmed(!answers);
            cluster.events.checked(answers);
            if answers {
                tracing::debug!(node = %node.addr, %error, "Redis Cluster calls failed but the node answers PING; its circuit stays closed");
                return;
            }
            let slots = cluster.map.slots_of(&node);
            tracing::error!(
                node = %node.addr,
                slots,
                %error,
                "Redis Cluster master unavailable: its hash slots are answered from failure modes; the other masters' are decided as before"
            );
            // Two ways back, watched at once: the node answers a probe
            // (each may wait the probe timeout on a hung node), or the slot
            // map, read every probe interval, no longer gives it slots.
            let interval = cluster.probe_interval;
            let answers = async {
                let mut probes = 0u64;
                loop {
                    tokio::time::sleep(interval).await;
                    probes += 1;
                    if cluster.probe_node(&node).await.is_ok() {
                        return probes;
                    }
                }
            };
            let moved = async {
                loop {
                    tokio::time::sleep(interval).await;
                    let _ = cluster.refresh(cluster.map.version()).await;
                    if cluster.map.slots_of(&node) == 0 {
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

impl Server for Arc<Cluster> {
    /// The Cluster's key in each thread's caches.
    fn id(&self) -> usize {
        self.connections.id()
    }

    /// How long a probe may take.
    fn probe_within(&self) -> Duration {
        self.connections.probe_within()
    }

    /// This thread's connection to the master serving `slot`.
    async fn connection(&self, slot: Slot) -> Result<Conn, StoreError> {
        let node = self.owner(slot).await?;
        self.connection_to(&node).await
    }

    /// This thread's connection to every master of the map.
    async fn master_connections(&self) -> Result<Vec<Conn>, StoreError> {
        let mut conns = Vec::new();
        for node in self.map.masters() {
            conns.push(self.connection_to(&node).await?);
        }
        Ok(conns)
    }

    /// `call`, within the store's timeout, its error a store error.
    async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        self.connections.timed(call).await
    }

    /// Masters whose circuit is open.
    fn open_masters(&self) -> Vec<String> {
        self.map.open_masters()
    }

    /// Runs `inv` on the master serving `slot`, following redirections;
    /// the caller bounds it by the request's deadline.
    async fn invoke(&self, slot: Slot, inv: &Invocation<'_>) -> Result<Value, StoreError> {
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
            let mut conn = self.connection_to(&node).await?;
            let mut pending = Pending {
                cluster: self,
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
                            self.map.node(&format!("{host}:{port}"))
                        }
                        None => self.map.node(addr),
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
                // A call whose keys are not all on one of the two nodes of
                // a slot being migrated: the caller decides it key by key.
                ErrorKind::Server(ServerErrorKind::TryAgain) if inv.yields_to_migration => {
                    return Err(StoreError::Migrating);
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

    /// Whether calls for `slot` stop at the breaker of the master serving it.
    fn slot_open(&self, slot: Slot) -> bool {
        self.map.owner(slot).is_some_and(|n| n.breaker.is_open())
    }

    /// Every master of the map answers PING (the map is read first): what
    /// readiness asks. The error names the masters that do not.
    async fn ping(&self) -> Result<(), StoreError> {
        self.refresh(self.map.version()).await?;
        let masters = self.map.masters();
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

    /// As [`Server::ping`]: a Cluster's probe reads its map and asks each
    /// master.
    async fn probe(&self) -> Result<(), StoreError> {
        self.ping().await
    }

    fn circuit_open(&self) -> bool {
        !self.open_masters().is_empty()
    }
}
