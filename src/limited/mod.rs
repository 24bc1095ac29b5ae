//! Who is being limited now: per rule, the clients refused most over the
//! last `--limited-window`, bounded whatever the number of clients (see
//! [`sketch`]). Every decided request is shown to it after its decision
//! (it is one of the limiter's observers); each thread counts in its own
//! shard, and `/limited`, the admin page and `/metrics` merge the shards.
//!
//! The hot path: a request nobody refused, on a thread that has tracked
//! nothing, costs a lock of the thread's own shard and a look at the
//! decision; otherwise a hash of each limited descriptor and a lookup.

mod merged;
mod sketch;

pub(crate) use merged::PUBLISH_EVERY;

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::clock::{Clock, Nanos};
use crate::limiter::{Decision, Observer, Request};
use crate::metrics::limited::{LimitedMetrics, LimitedRule};
use crate::rules::RuleSet;
use crate::shards::PerThread;
use sketch::{EPOCHS, RuleSketch, client_id, owned};

/// How much the view holds (`serve --limited-*`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimitedOptions {
    /// Clients per rule (`--limited-clients`); 0 turns the view off.
    pub clients: usize,
    /// Rules per thread (`--limited-rules`): refusals by rules beyond are
    /// only counted (`tollgate_limited_untracked_total`).
    pub rules: usize,
    /// How far back the view looks (`--limited-window`).
    pub window: Duration,
    /// Ranks per rule in `tollgate_limited_refusals` (`--limited-metric-ranks`).
    pub metric_ranks: usize,
}

impl Default for LimitedOptions {
    fn default() -> Self {
        Self {
            clients: 32,
            rules: 200,
            window: Duration::from_secs(300),
            metric_ranks: 3,
        }
    }
}

/// A thread's rules, keyed by whose counters they are (the rule's domain
/// and path as one hash, [`crate::store::scope_tag`]): two rules of one
/// name, or of one name in two domains, are two entries.
#[derive(Debug, Default)]
struct Shard {
    rules: HashMap<u64, RuleSketch, BuildHasherDefault<Tagged>>,
}

/// The keys are hashes already: used as they are.
#[derive(Debug, Default)]
struct Tagged(u64);

impl std::hash::Hasher for Tagged {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Both halves are hashes; mixed so the table's low bits see both.
        self.0 = n ^ n.rotate_left(32).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// The heaviest limited clients, per rule.
pub(crate) struct Limited {
    options: LimitedOptions,
    /// An epoch: a quarter of the window (at least 1 ns).
    epoch: Nanos,
    clock: Arc<dyn Clock>,
    shards: PerThread<Shard>,
    /// Refusals of rules past `--limited-rules`.
    untracked: AtomicU64,
    /// This instance's name among those sharing a store.
    instance: String,
    /// Whether the view last published (or, before any, the absence of
    /// one) says nobody is limited.
    published_empty: std::sync::atomic::AtomicBool,
}

/// One key and value of a descriptor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Entry {
    pub key: String,
    pub value: String,
}

/// One client of a rule, as `/limited` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ClientView {
    /// Every descriptor of its last refused request.
    pub descriptors: Vec<Vec<Entry>>,
    /// Refusals in the window (at most `error` too many).
    pub refused: u64,
    /// Admissions by the rule since it was tracked, in the window.
    pub admitted: u64,
    /// Its share of the rule's refusals in the window.
    pub share: f64,
    /// The most `refused` may overstate.
    pub error: u64,
    pub first_refused: String,
    pub last_refused: String,
    /// Identity across threads and instances (a hash of the counted
    /// descriptor), hex.
    pub id: String,
    #[serde(skip)]
    pub(crate) first_refused_at: Nanos,
    #[serde(skip)]
    pub(crate) last_refused_at: Nanos,
}

/// One rule, as `/limited` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RuleView {
    /// The rule's name, else its path (as response headers name it).
    pub rule: String,
    pub domain: String,
    /// Its path (`domain.key_value...`, as `/rlconfig` shows it), which
    /// names it unambiguously (a reset takes it), when the rule is still in
    /// force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Where it is written (`file:line`), when the rule is still in force.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Every refusal of the rule in the window.
    pub refused: u64,
    /// Heaviest first.
    pub clients: Vec<ClientView>,
}

/// `/limited`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct View {
    /// `instance`: this instance's requests; `merged`: every instance's.
    pub scope: String,
    /// Merged: how many instances' views are in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<usize>,
    pub window_seconds: u64,
    /// Clients held per rule: a client refused more than the rule's
    /// refusals divided by this is always shown.
    pub slots: usize,
    /// Heaviest rule first.
    pub rules: Vec<RuleView>,
}

impl std::fmt::Debug for Limited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limited")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Limited {
    /// A view with `options`, timed by `clock`.
    pub(crate) fn new(options: LimitedOptions, clock: Arc<dyn Clock>) -> Self {
        let window = u64::try_from(options.window.as_nanos()).unwrap_or(u64::MAX);
        Self {
            options,
            epoch: (window / EPOCHS as u64).max(1),
            clock,
            shards: PerThread::new(),
            untracked: AtomicU64::new(0),
            instance: String::from("this instance"),
            published_empty: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// The same, named `instance` among the instances sharing a store.
    pub(crate) fn named(mut self, instance: String) -> Self {
        self.instance = instance;
        self
    }

    /// Its name among the instances sharing a store.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// Drops rules with nothing left in the window, so a quiet thread's
    /// admissions go back to costing nothing.
    pub(crate) fn sweep(&self) {
        let epoch = self.clock.now() / self.epoch;
        self.shards
            .each_mut(|shard| shard.rules.retain(|_, rule| !rule.expired(epoch)));
    }

    /// This instance's view, `domain`'s rules only when given, each rule's
    /// clients matching `search` (a substring of a key or value) when given.
    pub(crate) fn view(&self, domain: Option<&str>, search: Option<&str>, rules: &RuleSet) -> View {
        let now = self.clock.now();
        let epoch = now / self.epoch;
        let mut merged: HashMap<u64, (RuleView, HashMap<u64, ClientView>)> = HashMap::new();
        self.shards.each(|shard| {
            for (&tag, sketch) in &shard.rules {
                if domain.is_some_and(|d| d != &*sketch.domain) {
                    continue;
                }
                let refused = sketch.refused.total(epoch);
                if refused == 0 {
                    continue;
                }
                let (rule, clients) = merged.entry(tag).or_insert_with(|| {
                    // The rule at its index, if it is still the same rule.
                    let now_in_force = sketch
                        .rule
                        .and_then(|i| rules.rules().get(i))
                        .filter(|r| crate::store::scope_tag(&r.domain, Some(&r.path)) == tag);
                    let rule = RuleView {
                        rule: sketch.policy.to_string(),
                        domain: sketch.domain.to_string(),
                        path: now_in_force.map(|r| r.path.clone()),
                        source: now_in_force
                            .map(|r| format!("{}:{}", r.source.file.display(), r.source.line)),
                        refused: 0,
                        clients: Vec::new(),
                    };
                    (rule, HashMap::new())
                });
                rule.refused += refused;
                for c in &sketch.clients {
                    let n = c.refused.total(epoch);
                    if n == 0 {
                        continue;
                    }
                    let view = clients.entry(c.id).or_insert_with(|| ClientView {
                        descriptors: Vec::new(),
                        refused: 0,
                        admitted: 0,
                        share: 0.0,
                        error: 0,
                        first_refused: String::new(),
                        last_refused: String::new(),
                        id: format!("{:016x}", c.id),
                        first_refused_at: Nanos::MAX,
                        last_refused_at: 0,
                    });
                    view.refused += n;
                    view.admitted += c.admitted.total(epoch);
                    view.error += c.error;
                    view.first_refused_at = view.first_refused_at.min(c.first_refused);
                    if c.last_refused >= view.last_refused_at {
                        view.last_refused_at = c.last_refused;
                        view.descriptors = c
                            .descriptors
                            .iter()
                            .map(|d| {
                                d.iter()
                                    .map(|(k, v)| Entry {
                                        key: k.to_string(),
                                        value: v.to_string(),
                                    })
                                    .collect()
                            })
                            .collect();
                    }
                }
            }
        });
        let mut view = View {
            scope: "instance".into(),
            instances: None,
            window_seconds: self.options.window.as_secs(),
            slots: self.options.clients,
            rules: merged
                .into_values()
                .map(|(mut rule, clients)| {
                    rule.clients = clients
                        .into_values()
                        .map(|mut c| {
                            c.first_refused = rfc3339(c.first_refused_at);
                            c.last_refused = rfc3339(c.last_refused_at);
                            c
                        })
                        .collect();
                    rule
                })
                .collect(),
        };
        view.finish(self.options.clients, search);
        view
    }

    /// The numbers `/metrics` shows: per rule, the refusals of its
    /// heaviest clients by rank, and the refusals of rules not tracked.
    pub(crate) fn metrics_snapshot(&self, rules: &RuleSet) -> LimitedMetrics {
        let view = self.view(None, None, rules);
        LimitedMetrics {
            ranks: self.options.metric_ranks,
            rules: view
                .rules
                .into_iter()
                .map(|r| LimitedRule {
                    rule: r.rule,
                    refused: r.refused,
                    ranks: r
                        .clients
                        .iter()
                        .take(self.options.metric_ranks)
                        .map(|c| c.refused)
                        .collect(),
                })
                .collect(),
            untracked: self.untracked.load(Relaxed),
        }
    }
}

impl View {
    /// Sorts (heaviest first), keeps `slots` clients per rule and those
    /// matching `search`, and works out each client's share.
    pub(crate) fn finish(&mut self, slots: usize, search: Option<&str>) {
        for rule in &mut self.rules {
            rule.clients
                .sort_by(|a, b| b.refused.cmp(&a.refused).then(a.id.cmp(&b.id)));
            rule.clients.truncate(slots);
            for c in &mut rule.clients {
                c.share = match rule.refused {
                    0 => 0.0,
                    n => (c.refused as f64 / n as f64).min(1.0),
                };
            }
            if let Some(search) = search.filter(|s| !s.is_empty()) {
                rule.clients.retain(|c| {
                    c.descriptors
                        .iter()
                        .flatten()
                        .any(|e| e.key.contains(search) || e.value.contains(search))
                });
            }
        }
        if search.is_some_and(|s| !s.is_empty()) {
            self.rules.retain(|r| !r.clients.is_empty());
        }
        self.rules
            .sort_by(|a, b| b.refused.cmp(&a.refused).then(a.rule.cmp(&b.rule)));
    }
}

/// Nanoseconds since the epoch as RFC 3339 (UTC).
fn rfc3339(at: Nanos) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(at))
        .map(|t| t.to_string())
        .unwrap_or_default()
}

impl Observer for Limited {
    fn observe(&self, request: &Request<'_>, decision: &Decision) {
        let refused = decision
            .statuses
            .iter()
            .any(|s| s.limits().any(|(_, over, _, _)| over));
        let mut shard = self.shards.mine();
        // Nobody refused here within the window: admissions cost nothing.
        if !refused && shard.rules.is_empty() {
            return;
        }
        let now = self.clock.now();
        let epoch = now / self.epoch;
        let domain = request.domain;
        for (d, status) in decision.statuses.iter().enumerate() {
            let Some(descriptor) = request.descriptors.get(d) else {
                continue;
            };
            // The descriptor's identity, hashed once whatever its limits,
            // and only when one of them needs it.
            let mut hashed = None;
            for (applied, over, _, _) in status.limits() {
                let mut id =
                    || *hashed.get_or_insert_with(|| client_id(domain, &descriptor.entries));
                if !over {
                    if let Some(rule) = shard.rules.get_mut(&applied.scope) {
                        rule.admit(id(), epoch);
                    }
                    continue;
                }
                if !shard.rules.contains_key(&applied.scope)
                    && shard.rules.len() >= self.options.rules
                {
                    shard.rules.retain(|_, rule| !rule.expired(epoch));
                    if shard.rules.len() >= self.options.rules {
                        self.untracked.fetch_add(1, Relaxed);
                        continue;
                    }
                }
                let rule = shard.rules.entry(applied.scope).or_insert_with(|| {
                    RuleSketch::new(domain.into(), applied.policy.clone(), applied.rule)
                });
                rule.rule = applied.rule;
                rule.refuse((id(), now, epoch), self.options.clients, || {
                    owned(request.descriptors.iter().map(|d| &d.entries[..]))
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
