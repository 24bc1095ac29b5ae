//! The Cluster's slot map: which master serves each hash slot, read from
//! `CLUSTER SLOTS`, and the nodes met so far, each with its own breaker.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;
use redis::Value;

use super::super::breaker::Breaker;
use super::super::conn::cache_id;

/// Hash slots in a Redis Cluster.
const SLOTS: usize = 16_384;
/// No master serves the slot (as far as the last map says).
const UNSERVED: u16 = u16::MAX;

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

/// A Cluster's slot map, the nodes Tollgate has met, and when the map was
/// read.
pub(super) struct Map {
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

impl Map {
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

    /// The seeds' URLs, as given.
    pub(super) fn seeds(&self) -> &[String] {
        &self.seeds
    }

    /// The master serving `slot`, by the last map read.
    pub(super) fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        self.topology.load().owner(slot).cloned()
    }

    /// Whether the map has no master yet (never read, or read empty).
    pub(super) fn is_empty(&self) -> bool {
        self.topology.load().masters.is_empty()
    }

    /// Slots `node` serves by the last map read.
    pub(super) fn slots_of(&self, node: &Node) -> usize {
        self.topology.load().slots_of(node)
    }

    /// How many reads of the map were done.
    pub(super) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Whether a read in the background is due: none started within
    /// `every`, and this caller won the right to start it.
    pub(super) fn refresh_due(&self, every: std::time::Duration) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let last = self.last_refresh.load(Ordering::Relaxed);
        now.saturating_sub(last) >= every.as_millis() as u64
            && self
                .last_refresh
                .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Starts a read unless one finished since `version` was seen: the
    /// guard to hold while reading, or `None` (the map is newer already).
    pub(super) async fn start_refresh(
        &self,
        version: u64,
    ) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        let one = self.refreshing.lock().await;
        if self.version() != version {
            return None;
        }
        self.last_refresh.store(
            (self.epoch.elapsed().as_millis() as u64).max(1),
            Ordering::Relaxed,
        );
        Some(one)
    }

    /// Every node met so far.
    pub(super) fn known(&self) -> Vec<Arc<Node>> {
        self.nodes.lock().values().cloned().collect()
    }

    /// The node at `addr`, met before or new.
    pub(super) fn node(&self, addr: &str) -> Arc<Node> {
        self.nodes
            .lock()
            .entry(addr.to_owned())
            .or_insert_with(|| {
                Arc::new(Node {
                    id: cache_id(),
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
    pub(super) fn masters(&self) -> Vec<Arc<Node>> {
        self.topology.load().masters.clone()
    }

    /// Installs a slot map read from a node (a read done: the version
    /// moves on); logs the masters that changed.
    pub(super) fn install(&self, ranges: &[(u16, u16, String)]) {
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
        self.version.fetch_add(1, Ordering::AcqRel);
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
pub(super) fn parse_slots(reply: &Value, asked: &str) -> Option<Vec<(u16, u16, String)>> {
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

/// The `host:port` of a seed URL.
pub(super) fn seed_addr(url: &str) -> String {
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
        let map = Map::new(vec!["redis://a:1".into()]);
        assert!(map.is_empty());
        map.install(&[(0, 100, "a:1".into()), (101, 16383, "b:2".into())]);
        assert_eq!(map.version(), 1);
        let b = map.owner(200).expect("served");
        assert_eq!(b.addr, "b:2");
        assert_eq!(map.slots_of(&b), 16383 - 100);
        // b's replica c takes its slots: b serves none, and keeps its id.
        map.install(&[(0, 100, "a:1".into()), (101, 16383, "c:3".into())]);
        assert_eq!(map.slots_of(&b), 0);
        assert_eq!(map.owner(200).expect("served").addr, "c:3");
        assert_eq!(map.node("b:2").id, b.id);
        assert!(map.owner(0).is_some());
    }
}
