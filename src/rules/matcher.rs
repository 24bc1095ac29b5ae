//! Descriptor matching, exactly as the reference: at each level take the entry
//! with the same key and value, else the first wildcard value that matches (in
//! file order), else the key-only default; a limit applies only when the
//! matched node is at the request descriptor's last entry; a node without
//! children ends the walk.

use std::sync::Arc;

use smallvec::SmallVec;

use super::glob::Glob;
use super::{Rule, RuleSet};

/// The rules under one descriptor level, by entry key.
#[derive(Debug, Default, Clone)]
pub(crate) struct Level {
    pub(crate) keys: hashbrown::HashMap<Box<str>, KeyRules>,
}

/// Every rule for one entry key at one level.
#[derive(Debug, Default, Clone)]
pub(crate) struct KeyRules {
    pub(crate) exact: hashbrown::HashMap<Box<str>, Node>,
    pub(crate) wildcards: Vec<(Glob, Node)>,
    pub(crate) default: Option<Node>,
}

impl KeyRules {
    /// The node for `value`: the exact value, else the first wildcard that
    /// matches (in file order), else the key-only default.
    fn node_for(&self, value: &str) -> Option<&Node> {
        self.exact
            .get(value)
            .or_else(|| {
                self.wildcards
                    .iter()
                    .find(|(glob, _)| glob.matches(value))
                    .map(|(_, node)| node)
            })
            .or(self.default.as_ref())
    }
}

/// One descriptor of a rule file.
#[derive(Debug, Default, Clone)]
pub(crate) struct Node {
    /// The descriptor's limits: one for `rate_limit`, several for
    /// `rate_limits`, none without either.
    pub(crate) rules: SmallVec<[Arc<Rule>; 1]>,
    pub(crate) children: Level,
    /// `share_threshold` on a wildcard: every matching value shares one
    /// counter, keyed by the pattern.
    pub(crate) shared_pattern: Option<Box<str>>,
    /// `lanes`: a last entry of this key names the lane a request counts in.
    pub(crate) lanes: Option<Lanes>,
    /// The rules on which calls hold request IDs: the in-flight cap first
    /// (when there is one), then the budgets with `reserve: true` (also in
    /// `rules`). See `held`.
    pub(crate) held: SmallVec<[Arc<Rule>; 1]>,
}

impl Node {
    /// The rules a last entry `key` (one of `held::HOLD_KEYS`) concerns:
    /// `request_id` every held rule, `release` the in-flight cap, `settle`
    /// the reserved budgets.
    fn held_for(&self, key: &str) -> &[Arc<Rule>] {
        let capped = self.held.first().is_some_and(|r| {
            r.limit
                .is_some_and(|l| l.held == Some(super::HeldKind::InFlight))
        });
        match key {
            "release" => &self.held[..usize::from(capped)],
            "settle" => &self.held[usize::from(capped)..],
            _ => &self.held,
        }
    }
}

/// Priority lanes on one descriptor: a request whose descriptor is the
/// node's entries plus `key: LANE` counts in the node's own counter, and is
/// admitted only while the counter is below the lane's share of the limit.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lanes {
    /// The entry key that names the lane.
    pub(crate) key: Box<str>,
    /// Each lane's share of the limit, in percent (1-100); a lane not
    /// listed counts at 100.
    pub(crate) shares: hashbrown::HashMap<Box<str>, u8>,
}

impl Lanes {
    /// The share of `lane`, in percent.
    fn share(&self, lane: &str) -> u8 {
        self.shares.get(lane).copied().unwrap_or(100)
    }
}

/// The rules a descriptor matched (one per limit of the descriptor), and the
/// entries whose counter key uses the wildcard pattern instead of the value
/// (`share_threshold`).
#[derive(Debug)]
pub struct Matched<'a> {
    /// The rules, empty only for a `hold` the node has no rule for: all of
    /// them must admit a request.
    pub rules: &'a [Arc<Rule>],
    /// `(entry index, pattern)` for shared wildcard entries; usually empty.
    pub shared: SmallVec<[(usize, &'a str); 1]>,
    /// When the descriptor's last entry names a priority lane (`lanes`):
    /// the lane's share of the limit, in percent. That entry is not part of
    /// the counter's key: every lane counts in the node's one counter.
    pub lane: Option<u8>,
    /// The descriptor's last entry holds, frees or settles a request ID
    /// (`request_id`, `release`, `settle`): it is not part of the counter's
    /// key, and `rules` are the node's held rules it concerns, empty when
    /// the node has none (a per-request error).
    pub hold: bool,
}

impl RuleSet {
    /// The rules for one request descriptor (its entries in order), if any.
    pub fn lookup<'a>(&'a self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
        let mut level = self.domains.get(domain)?;
        let mut shared = SmallVec::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            let node = level.keys.get(*key)?.node_for(value)?;
            if let Some(pattern) = &node.shared_pattern {
                shared.push((i, &**pattern));
            }
            if i + 1 == entries.len() {
                return (!node.rules.is_empty()).then_some(Matched {
                    rules: &node.rules,
                    shared,
                    lane: None,
                    hold: false,
                });
            }
            // A request ID, last: the node's held rules decide it (rules
            // refuse a child with a hold key under a node that holds).
            let last = entries[i + 1].0;
            if i + 2 == entries.len()
                && super::held::HOLD_KEYS.contains(&last)
                && !node.children.keys.contains_key(last)
            {
                return Some(Matched {
                    rules: node.held_for(last),
                    shared,
                    lane: None,
                    hold: true,
                });
            }
            // The lane's entry, last: no child has its key (rules refuse it).
            if let Some(lanes) = &node.lanes
                && i + 2 == entries.len()
                && *lanes.key == *entries[i + 1].0
            {
                return (!node.rules.is_empty()).then_some(Matched {
                    rules: &node.rules,
                    shared,
                    lane: Some(lanes.share(entries[i + 1].1)),
                    hold: false,
                });
            }
            if node.children.keys.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}

/// One entry of a descriptor's shape (see [`RuleSet::reachable`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShapeEntry<'a> {
    pub(crate) key: &'a str,
    /// The value, when it is known; `None`: any value.
    pub(crate) value: Option<&'a str>,
    /// The entry may be absent (Envoy's `skip_if_absent`).
    pub(crate) optional: bool,
}

impl RuleSet {
    /// The rules (limited or `unlimited`) a descriptor of this shape could
    /// meet in `domain`: its entries' keys in order, each with its value
    /// when it is known, some perhaps absent. For `tollgate check
    /// --envoy-config`.
    pub(crate) fn reachable<'a>(
        &'a self,
        domain: &str,
        shape: &[ShapeEntry<'_>],
    ) -> Vec<&'a Arc<Rule>> {
        let mut found = Vec::new();
        if let Some(level) = self.domains.get(domain) {
            reach(level, shape, &mut found);
        }
        found.sort_by_key(|r| r.index);
        found.dedup_by_key(|r| r.index);
        found
    }
}

/// The rules `shape` can meet below `level` (see [`RuleSet::reachable`]):
/// a node's rules count where the descriptor can end (every entry after it
/// optional).
fn reach<'a>(level: &'a Level, shape: &[ShapeEntry<'_>], found: &mut Vec<&'a Arc<Rule>>) {
    let Some((entry, rest)) = shape.split_first() else {
        return;
    };
    if entry.optional {
        reach(level, rest, found);
    }
    let Some(rules) = level.keys.get(entry.key) else {
        return;
    };
    let nodes: Vec<&Node> = match entry.value {
        Some(value) => rules.node_for(value).into_iter().collect(),
        // Any value: every node of the key can be met.
        None => rules
            .exact
            .values()
            .chain(rules.wildcards.iter().map(|(_, node)| node))
            .chain(&rules.default)
            .collect(),
    };
    let may_end = rest.iter().all(|e| e.optional);
    for node in nodes {
        // A lane's entry, last, ends the descriptor at this node too.
        let lane_ends = node.lanes.as_ref().is_some_and(|l| {
            rest.split_first()
                .is_some_and(|(e, after)| *l.key == *e.key && after.iter().all(|e| e.optional))
        });
        if may_end || lane_ends {
            found.extend(node.rules.iter());
        }
        // A request ID's entry, last, reaches the node's held rules.
        if let Some((e, after)) = rest.split_first()
            && super::held::HOLD_KEYS.contains(&e.key)
            && after.iter().all(|e| e.optional)
            && !node.children.keys.contains_key(e.key)
        {
            found.extend(node.held_for(e.key).iter());
        }
        if !rest.is_empty() && !node.children.keys.is_empty() {
            reach(&node.children, rest, found);
        }
    }
}

/// A bucket's entries in the order the rule tree used them.
pub type WalkedEntries<'b> = SmallVec<[(&'b str, &'b str); 4]>;

/// The most nodes one bucket lookup visits: a bucket's entries can be
/// tried in many orders, and a client must not make a lookup expensive.
const BUCKET_WALK_STEPS: usize = 256;

impl RuleSet {
    /// The rules for a rate limit quota (RLQS) bucket: a map of entries
    /// with no order. The walk starts at the domain's top level and, at each
    /// level, takes one of the bucket's unused entries whose key the level
    /// has and whose value matches as usual (exact, else wildcard, else
    /// key-only); the bucket's rules are those of the node where its entries
    /// are used up. When several entries fit a level, they are tried in key
    /// order and the first walk that uses every entry wins (at most
    /// `BUCKET_WALK_STEPS` nodes are visited). Also returns the entries in
    /// the order the walk used them: the descriptor a ShouldRateLimit call
    /// would send for the same limit.
    ///
    /// `entries` must be sorted by key.
    pub fn lookup_bucket<'a, 'b>(
        &'a self,
        domain: &str,
        entries: &[(&'b str, &'b str)],
    ) -> Option<(Matched<'a>, WalkedEntries<'b>)> {
        let level = self.domains.get(domain)?;
        let mut walk = BucketWalk {
            entries,
            used: vec![false; entries.len()],
            walked: SmallVec::new(),
            shared: SmallVec::new(),
            steps: 0,
        };
        let node = walk.from(level)?;
        Some((
            Matched {
                lane: None,
                hold: false,
                rules: &node.rules,
                shared: walk.shared,
            },
            walk.walked,
        ))
    }
}

/// A depth-first walk of the rule tree for one bucket.
struct BucketWalk<'a, 'b, 'e> {
    entries: &'e [(&'b str, &'b str)],
    used: Vec<bool>,
    walked: WalkedEntries<'b>,
    shared: SmallVec<[(usize, &'a str); 1]>,
    steps: usize,
}

impl<'a, 'b> BucketWalk<'a, 'b, '_> {
    /// The node with rules where every entry is used, walking down from `level`.
    fn from(&mut self, level: &'a Level) -> Option<&'a Node> {
        for i in 0..self.entries.len() {
            if self.used[i] {
                continue;
            }
            let (key, value) = self.entries[i];
            let Some(node) = level.keys.get(key).and_then(|rules| rules.node_for(value)) else {
                continue;
            };
            self.steps += 1;
            if self.steps > BUCKET_WALK_STEPS {
                return None;
            }
            self.used[i] = true;
            let shared = self.shared.len();
            if let Some(pattern) = &node.shared_pattern {
                self.shared.push((self.walked.len(), &**pattern));
            }
            self.walked.push(self.entries[i]);
            if self.walked.len() == self.entries.len() {
                if !node.rules.is_empty() {
                    return Some(node);
                }
            } else if let Some(found) = self.from(&node.children) {
                return Some(found);
            }
            self.walked.pop();
            self.shared.truncate(shared);
            self.used[i] = false;
        }
        None
    }
}
