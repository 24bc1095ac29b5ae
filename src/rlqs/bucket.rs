//! One bucket's state: the rule it resolves to, each client's demand, what
//! the other instances said, and the assignment a client gets from them.
//! Proto-free; time is passed in.

use std::collections::HashMap;
use std::sync::Arc;

use super::answer::Entries;
use super::options::{COUNTED_PERIOD_SECONDS, DEMAND_STALE, MAX_DEPARTED, QuotaOptions, Unmatched};
use super::share::{self, Assignment, Claim, Split};
use crate::algorithm::NANOS_PER_TICK;
use crate::clock::{NANOS_PER_SEC, Nanos};

/// How old a bucket's split may be when a report reads it: reports a few
/// milliseconds apart see each other's demand, and a bucket is divided at
/// most 100 times a second however many streams report it, or how fast.
const SPLIT_REFRESH: Nanos = NANOS_PER_SEC / 100;

/// The time a split may wait per client it weighs (10 µs: 10,000 clients
/// are divided again at most every 100 ms).
const SPLIT_COST_PER_CLIENT: Nanos = 10_000;

/// Seconds per tick of the windows' clock.
const TICK_SECONDS: f64 = NANOS_PER_TICK as f64 / NANOS_PER_SEC as f64;
use crate::rules::{OverLimit, Rule, RuleSet};

/// What a bucket's rules say.
#[derive(Debug, Clone)]
pub(super) enum Resolved {
    /// No rule matches.
    Unmatched,
    /// A rule without a limit, in shadow mode or a soft limit (`over_limit:
    /// tag`, which RLQS cannot carry): Envoy enforces what it is told, so a
    /// rule that must never refuse allows all.
    Unlimited(Arc<Rule>),
    /// A limit.
    Limited {
        rule: Arc<Rule>,
        quota: crate::algorithm::Quota,
        limit: u64,
        period_seconds: u64,
    },
}

impl Resolved {
    pub(super) fn rule(&self) -> Option<&Arc<Rule>> {
        match self {
            Resolved::Unmatched => None,
            Resolved::Unlimited(rule) | Resolved::Limited { rule, .. } => Some(rule),
        }
    }

    pub(super) fn same(&self, other: &Resolved) -> bool {
        match (self, other) {
            (Resolved::Unmatched, Resolved::Unmatched) => true,
            (Resolved::Unlimited(a), Resolved::Unlimited(b)) => a.path == b.path,
            // The limit and period are the rule's.
            (Resolved::Limited { rule: a, .. }, Resolved::Limited { rule: b, .. }) => {
                a.path == b.path && a.limit == b.limit
            }
            _ => false,
        }
    }
}

/// The rules of a bucket (entries sorted by key). A descriptor with several
/// limits (`rate_limits`) is held to its lowest rate.
pub(super) fn resolve(rules: &RuleSet, domain: &str, entries: &[(String, String)]) -> Resolved {
    let borrowed: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let Some((matched, _)) = rules.lookup_bucket(domain, &borrowed) else {
        return Resolved::Unmatched;
    };
    let rate = |r: &Arc<Rule>| {
        r.limit.map_or(f64::INFINITY, |l| {
            f64::from(l.requests_per_unit) / l.period_seconds() as f64
        })
    };
    let Some(rule) = matched
        .rules
        .iter()
        .min_by(|a, b| rate(a).total_cmp(&rate(b)))
    else {
        return Resolved::Unmatched;
    };
    match rule.limit {
        Some(limit) if !rule.shadow_mode && rule.over_limit == OverLimit::Refuse => {
            Resolved::Limited {
                rule: rule.clone(),
                quota: limit.quota(),
                limit: u64::from(limit.requests_per_unit),
                period_seconds: limit.period_seconds().max(1),
            }
        }
        _ => Resolved::Unlimited(rule.clone()),
    }
}

/// One client's demand for one bucket.
#[derive(Debug, Clone, Copy)]
pub(super) struct Demand {
    /// Requests per second (allowed and denied) as reported, once a report
    /// covered time (the split counts it up to the bucket's rate).
    pub(super) rate: Option<f64>,
    /// When it last reported.
    pub(super) at: Nanos,
}

impl Demand {
    fn fresh(&self, now: Nanos) -> bool {
        now.saturating_sub(self.at) <= DEMAND_STALE
    }
}

/// One stream's part in a bucket: its demand and what it was last sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub(super) demand: Demand,
    pub(super) sent: Option<Assignment>,
}

/// What the other instances (through the store) said about a bucket.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct OtherInstances {
    /// Weight of the other instances' clients.
    pub(super) others: f64,
    /// The window `used` counts.
    pub(super) window: u64,
    /// Admitted in `window` by every instance, as of the last exchange
    /// (this instance's own reports included as they arrive).
    pub(super) used: u64,
    /// Admitted here in `window` and not yet sent to the store.
    pub(super) pending: u64,
    /// When the store last answered.
    pub(super) synced: Option<Nanos>,
}

/// One bucket.
#[derive(Debug)]
pub(super) struct Bucket {
    /// Its canonical name (see [`bucket_name`]): the key it is held under,
    /// shared with the streams that report it.
    pub(super) name: Arc<str>,
    pub(super) domain: String,
    /// Sorted by key; shared with the answers that name the bucket.
    pub(super) entries: Entries,
    pub(super) resolved: Resolved,
    /// The streams that report the bucket, by stream id.
    pub(super) members: HashMap<u64, Member>,
    /// The demand of named clients whose stream ended, kept until it is
    /// stale (at most [`MAX_DEPARTED`]): reconnected, a client takes its
    /// demand back. Pooled meanwhile (see [`Split`]).
    pub(super) departed: HashMap<Arc<str>, Demand>,
    pub(super) global: OtherInstances,
    /// The division of the rate, made at the last tick (or when the bucket
    /// appeared); a report moves its own client's share at once, everyone
    /// else's at the next tick.
    pub(super) split: Split,
    /// When `split` was made.
    pub(super) split_at: Nanos,
}

impl Bucket {
    /// A bucket that `resolved` says something about.
    pub(super) fn new(name: Arc<str>, domain: &str, entries: Entries, resolved: Resolved) -> Self {
        // Split when its first client joins.
        Bucket {
            name,
            domain: domain.to_owned(),
            entries,
            resolved,
            members: HashMap::new(),
            departed: HashMap::new(),
            global: OtherInstances::default(),
            split: Split::new(0.0, &[], 0.0, 0.0),
            split_at: 0,
        }
    }

    /// What a bucket named `name` takes beside its fixed size: its name
    /// (held once, shared by the streams) and its entries (a copy).
    pub(super) fn bytes_of(name: &str) -> usize {
        2 * name.len() + std::mem::size_of::<Bucket>()
    }

    /// The bucket's requests per second, when it has a limit.
    pub(super) fn rate(&self) -> Option<f64> {
        match &self.resolved {
            Resolved::Limited {
                limit,
                period_seconds,
                ..
            } => Some(*limit as f64 / *period_seconds as f64),
            _ => None,
        }
    }

    /// Divides the rate again among the fresh clients (see [`Split`]).
    pub(super) fn resplit(&mut self, now: Nanos, min_share: f64) {
        let Some(rate) = self.rate() else {
            return;
        };
        let live = self
            .members
            .values()
            .filter(|m| m.demand.fresh(now))
            .map(|m| Claim {
                demand: m.demand.rate,
                live: true,
            });
        let departed = self
            .departed
            .values()
            .filter(|d| d.fresh(now))
            .map(|d| Claim {
                demand: d.rate,
                live: false,
            });
        let claims: Vec<Claim> = live.chain(departed).collect();
        self.split = Split::new(rate, &claims, self.global.others, min_share);
        self.split_at = now;
    }

    /// Divides the rate again when the split is older than
    /// [`SPLIT_REFRESH`] (longer for a bucket of many clients); true when
    /// it did.
    pub(super) fn refresh(&mut self, now: Nanos, min_share: f64) -> bool {
        // A split costs O(clients): a big bucket is divided less often, so
        // that dividing it takes at most about 1 % of a core.
        let every = SPLIT_REFRESH.max(self.members.len() as Nanos * SPLIT_COST_PER_CLIENT);
        let stale = now.saturating_sub(self.split_at) >= every;
        if stale {
            self.resplit(now, min_share);
        }
        stale
    }

    /// Forgets departed clients whose demand went stale.
    pub(super) fn forget_departed(&mut self, now: Nanos) {
        self.departed.retain(|_, d| d.fresh(now));
    }

    /// Keeps a named client's demand after its stream ended, within the
    /// bound.
    pub(super) fn depart(&mut self, name: Arc<str>, demand: Demand) {
        if self.departed.len() < MAX_DEPARTED || self.departed.contains_key(&name) {
            self.departed.insert(name, demand);
        }
    }

    /// The assignment now for a client whose demand is `demand`.
    pub(super) fn assignment(
        &self,
        demand: Option<f64>,
        now: Nanos,
        options: &QuotaOptions,
    ) -> Assignment {
        self.assignment_with(demand, now, options, |split, claim| split.share(claim))
    }

    /// The assignment now for a client that joined since the split was made
    /// (see [`Split::share_of_newcomer`]).
    pub(super) fn newcomer_assignment(
        &self,
        demand: Option<f64>,
        now: Nanos,
        options: &QuotaOptions,
    ) -> Assignment {
        self.assignment_with(demand, now, options, |split, claim| {
            split.share_of_newcomer(claim)
        })
    }

    fn assignment_with(
        &self,
        demand: Option<f64>,
        now: Nanos,
        options: &QuotaOptions,
        share_of: impl Fn(&Split, Claim) -> f64,
    ) -> Assignment {
        match &self.resolved {
            Resolved::Unmatched => unmatched(options),
            Resolved::Unlimited(_) => Assignment::AllowAll,
            Resolved::Limited {
                quota,
                limit,
                period_seconds,
                ..
            } => {
                if *period_seconds >= COUNTED_PERIOD_SECONDS {
                    let window = quota.window_at(now).index;
                    if window == self.global.window && self.global.used >= *limit {
                        return Assignment::DenyAll;
                    }
                }
                let share = share_of(&self.split, Claim { demand, live: true });
                share::token_bucket(share, *limit, *period_seconds)
            }
        }
    }

    /// The most requests a client holding `sent` can have admitted over
    /// `elapsed` seconds (its bucket's burst and fills), at most the limit:
    /// what a report may count, whatever it says.
    pub(super) fn admissible(&self, sent: Option<&Assignment>, elapsed: f64) -> u64 {
        let Resolved::Limited { limit, .. } = &self.resolved else {
            return u64::MAX;
        };
        match sent {
            Some(Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_seconds,
                ..
            }) => {
                let fills = (elapsed.max(0.0) / f64::from((*fill_seconds).max(1))).ceil();
                let most = f64::from(*max_tokens) + f64::from(*tokens_per_fill) * fills;
                (most.min(*limit as f64)) as u64
            }
            // Allowed all before the bucket was limited, or not told yet
            // (Envoy's no_assignment_behavior): up to the limit.
            _ => *limit,
        }
    }

    /// Counts `allowed` requests, reported now over the last `elapsed`
    /// seconds, into the window: a report that straddles the window's start
    /// counts only the part after it (spread evenly), as its requests
    /// happened then.
    pub(super) fn count(&mut self, allowed: u64, elapsed: f64, now: Nanos, shared_store: bool) {
        let Resolved::Limited {
            quota,
            limit,
            period_seconds,
            ..
        } = &self.resolved
        else {
            return;
        };
        if *period_seconds < COUNTED_PERIOD_SECONDS {
            return;
        }
        let window = quota.window_at(now);
        if window.index != self.global.window {
            self.global.window = window.index;
            self.global.used = 0;
            self.global.pending = 0;
        }
        let now_ticks = now / NANOS_PER_TICK;
        let since_start = now_ticks.saturating_sub(window.start) as f64 * TICK_SECONDS;
        let allowed = if elapsed > since_start && elapsed > 0.0 {
            (allowed as f64 * since_start / elapsed).round() as u64
        } else {
            allowed
        };
        // Past the limit a count changes nothing (the window is refused),
        // and bounded counts keep the store's counter far from overflow.
        self.global.used = self.global.used.saturating_add(allowed).min(*limit);
        if shared_store {
            self.global.pending = self.global.pending.saturating_add(allowed).min(*limit);
        }
    }
}

/// What a bucket without a limit's rule gets.
pub(super) fn unmatched(options: &QuotaOptions) -> Assignment {
    match options.unmatched {
        Unmatched::Allow => Assignment::AllowAll,
        Unmatched::Deny => Assignment::DenyAll,
    }
}

/// A bucket's canonical name: the domain and the sorted entries.
pub(super) fn bucket_name(domain: &str, entries: &[(String, String)]) -> Arc<str> {
    let mut name = String::with_capacity(64);
    name.push_str(domain);
    for (k, v) in entries {
        name.push('\u{0}');
        name.push_str(k);
        name.push('\u{0}');
        name.push_str(v);
    }
    name.into()
}
