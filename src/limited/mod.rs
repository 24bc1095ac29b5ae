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
mod view;

pub(crate) use merged::PUBLISH_EVERY;

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::clock::{Clock, Nanos};
use crate::limiter::{Decision, Observer, Request};
use crate::metrics::limited::{LimitedMetrics, LimitedRule};
use crate::rules::RuleSet;
use crate::shards::PerThread;
use sketch::{EPOCHS, RuleSketch, client_id, owned};
use view::rfc3339;
pub(crate) use view::{ClientView, Entry, RuleView, View};

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
    /// The most the whole view holds, in bytes (`--limited-max-bytes`).
    pub max_bytes: usize,
}

impl Default for LimitedOptions {
    fn default() -> Self {
        Self {
            clients: 32,
            rules: 200,
            window: Duration::from_secs(300),
            metric_ranks: 3,
            max_bytes: 64 << 20,
        }
    }
}

/// A thread's rules, keyed by whose counters they are (the rule's domain
/// and path as one hash, [`crate::store::scope_tag`]): two rules of one
/// name, or of one name in two domains, are two entries.
#[derive(Debug, Default)]
struct Shard {
    rules: HashMap<u64, RuleSketch, BuildHasherDefault<Tagged>>,
    /// Clients held by all its rules (each counted at its largest,
    /// [`sketch::CLIENT_BYTES`]; a rule itself counts as one).
    held: usize,
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
    /// Clients (and rules) one shard may hold: `--limited-max-bytes`
    /// shared by the shards, each client counted at its largest.
    held_per_shard: usize,
    /// Refusals of rules past `--limited-rules`, or of clients past
    /// `--limited-max-bytes`.
    untracked: AtomicU64,
    /// This instance's name among those sharing a store.
    instance: String,
    /// Whether the view last published (or, before any, the absence of
    /// one) says nobody is limited.
    published_empty: std::sync::atomic::AtomicBool,
}

/// A rule's record as copied out of a shard (see [`Limited::view`]).
struct Taken {
    domain: Arc<str>,
    policy: Arc<str>,
    rule: Option<usize>,
    refused: u64,
    clients: Vec<TakenClient>,
}

/// A client's record as copied out of a shard.
struct TakenClient {
    id: u64,
    refused: u64,
    admitted: u64,
    error: u64,
    first: Nanos,
    last: Nanos,
    descriptors: sketch::Descriptors,
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
        let shards = PerThread::new();
        let held_per_shard = (options.max_bytes / shards.len() / sketch::CLIENT_BYTES).max(1);
        Self {
            options,
            epoch: (window / EPOCHS as u64).max(1),
            clock,
            shards,
            held_per_shard,
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
        self.shards.each_mut(|shard| {
            shard.rules.retain(|_, rule| !rule.expired(epoch));
            shard.held = shard.rules.values().map(|r| r.clients.len() + 1).sum();
        });
    }

    /// This instance's view, `domain`'s rules only when given, each rule's
    /// clients matching `search` (a substring of a key or value) when given.
    pub(crate) fn view(&self, domain: Option<&str>, search: Option<&str>, rules: &RuleSet) -> View {
        let now = self.clock.now();
        let epoch = now / self.epoch;
        // Under each shard's lock, only numbers and shared pointers are
        // copied: its thread's decisions wait for that, never for the
        // text and JSON made below.
        let mut taken: Vec<(u64, Taken)> = Vec::new();
        self.shards.each(|shard| {
            for (&tag, sketch) in &shard.rules {
                if domain.is_some_and(|d| d != &*sketch.domain) {
                    continue;
                }
                let refused = sketch.refused.total(epoch);
                if refused == 0 {
                    continue;
                }
                let clients = sketch
                    .clients
                    .iter()
                    .filter_map(|c| {
                        let n = c.refused.total(epoch);
                        (n > 0).then(|| TakenClient {
                            id: c.id,
                            refused: n,
                            admitted: c.admitted.total(epoch),
                            error: c.error,
                            first: c.first_refused,
                            last: c.last_refused,
                            descriptors: c.descriptors.clone(),
                        })
                    })
                    .collect();
                taken.push((
                    tag,
                    Taken {
                        domain: sketch.domain.clone(),
                        policy: sketch.policy.clone(),
                        rule: sketch.rule,
                        refused,
                        clients,
                    },
                ));
            }
        });
        let mut merged: HashMap<u64, (RuleView, HashMap<u64, ClientView>)> = HashMap::new();
        for (tag, sketch) in taken {
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
            rule.refused = rule.refused.saturating_add(sketch.refused);
            for c in sketch.clients {
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
                view.refused = view.refused.saturating_add(c.refused);
                view.admitted = view.admitted.saturating_add(c.admitted);
                view.error = view.error.saturating_add(c.error);
                view.first_refused_at = view.first_refused_at.min(c.first);
                if c.last >= view.last_refused_at {
                    view.last_refused_at = c.last;
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
        let mut view = View {
            scope: "instance".into(),
            instances: None,
            window_seconds: self.options.window.as_secs(),
            slots: self.options.clients,
            total_rules: None,
            next_offset: None,
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

impl Observer for Limited {
    /// A refused request is one step, whatever its descriptors: the first
    /// limit that refused it is counted to its client (a request of 128
    /// refused descriptors costs what one of one does). An admitted request
    /// counts to each tracked client it touches; a thread that tracks
    /// nothing pays a look at the decision.
    fn observe(&self, request: &Request<'_>, decision: &Decision) {
        let refused = decision.statuses.iter().enumerate().find_map(|(d, s)| {
            s.limits()
                .find(|(_, over, _, _, _)| *over)
                .map(|(applied, _, _, _, _)| (d, applied))
        });
        let mut shard = self.shards.mine();
        let domain = request.domain;
        let Some((d, applied)) = refused else {
            // Nobody refused here within the window: admissions cost nothing
            // (not even a look at the clock).
            if shard.rules.is_empty() {
                return;
            }
            let epoch = self.clock.now() / self.epoch;
            for (d, status) in decision.statuses.iter().enumerate() {
                let Some(descriptor) = request.descriptors.get(d) else {
                    continue;
                };
                // Hashed once whatever its limits, only when one needs it.
                let mut hashed = None;
                for (applied, _, _, _, _) in status.limits() {
                    if let Some(rule) = shard.rules.get_mut(&applied.scope) {
                        let id = *hashed
                            .get_or_insert_with(|| client_id(domain, client(&descriptor.entries)));
                        rule.admit(id, epoch);
                    }
                }
            }
            return;
        };
        let Some(descriptor) = request.descriptors.get(d) else {
            return;
        };
        let now = self.clock.now();
        let epoch = now / self.epoch;
        let shard = &mut *shard;
        if !shard.rules.contains_key(&applied.scope) {
            if shard.rules.len() >= self.options.rules || shard.held >= self.held_per_shard {
                shard.rules.retain(|_, rule| !rule.expired(epoch));
                shard.held = shard.rules.values().map(|r| r.clients.len() + 1).sum();
            }
            if shard.rules.len() >= self.options.rules || shard.held >= self.held_per_shard {
                self.untracked.fetch_add(1, Relaxed);
                return;
            }
            shard.held += 1;
        }
        let rule = shard.rules.entry(applied.scope).or_insert_with(|| {
            RuleSketch::new(domain.into(), applied.policy.clone(), applied.rule)
        });
        rule.rule = applied.rule;
        // A new client takes a free slot only while the shard has room; a
        // full shard still counts the refusal, and a heavier newcomer still
        // takes the lightest client's slot.
        let slots = if shard.held < self.held_per_shard {
            self.options.clients
        } else {
            rule.clients.len().max(1)
        };
        let before = rule.clients.len();
        rule.refuse(
            (client_id(domain, client(&descriptor.entries)), now, epoch),
            slots,
            || owned(request.descriptors.iter().map(|d| client(&d.entries))),
        );
        shard.held += rule.clients.len() - before;
    }
}

/// Who a descriptor's entries name: without a last request ID entry
/// (`request_id`, `release`, `settle`), which tells requests apart, not
/// clients.
fn client<'e, 'a>(entries: &'e [(&'a str, &'a str)]) -> &'e [(&'a str, &'a str)] {
    match entries.split_last() {
        Some(((key, _), rest))
            if !rest.is_empty() && crate::rules::held::HOLD_KEYS.contains(key) =>
        {
            rest
        }
        _ => entries,
    }
}

#[cfg(test)]
mod tests;
