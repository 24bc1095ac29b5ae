//! One bucket's state: the rule it resolves to, each client's demand, what
//! the other instances said, and the assignment a client gets from them.
//! Proto-free; time is passed in.

use std::collections::HashMap;
use std::sync::Arc;

use super::options::{COUNTED_PERIOD_SECONDS, DEMAND_STALE, QuotaOptions, Unmatched};
use super::share::{self, Assignment};
use crate::clock::Nanos;
use crate::rules::{Rule, RuleSet};

/// What a bucket's rules say.
#[derive(Debug, Clone)]
pub(super) enum Resolved {
    /// No rule matches.
    Unmatched,
    /// A rule without a limit, or in shadow mode (Envoy enforces what it is
    /// told, so a rule that must never refuse allows all).
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
        Some(limit) if !rule.shadow_mode => Resolved::Limited {
            rule: rule.clone(),
            quota: limit.quota(),
            limit: u64::from(limit.requests_per_unit),
            period_seconds: limit.period_seconds().max(1),
        },
        _ => Resolved::Unlimited(rule.clone()),
    }
}

/// One client's demand for one bucket.
#[derive(Debug, Clone, Copy)]
pub(super) struct Demand {
    /// Requests per second (allowed and denied), once a report covered time.
    pub(super) rate: Option<f64>,
    /// When it last reported.
    pub(super) at: Nanos,
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
    /// Admitted here and not yet sent to the store.
    pub(super) pending: u64,
    /// When the store last answered.
    pub(super) synced: Option<Nanos>,
}

/// One bucket.
#[derive(Debug)]
pub(super) struct Bucket {
    pub(super) domain: String,
    /// Sorted by key.
    pub(super) entries: Vec<(String, String)>,
    pub(super) resolved: Resolved,
    pub(super) clients: HashMap<Arc<str>, Demand>,
    /// The last assignment sent to each stream that reported the bucket.
    pub(super) sent: HashMap<u64, Assignment>,
    pub(super) global: OtherInstances,
}

impl Bucket {
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

    /// Each fresh client's weight (see [`share::weight`]).
    pub(super) fn weights(&self, now: Nanos, min_share: f64) -> Vec<(Arc<str>, f64)> {
        let Some(rate) = self.rate() else {
            return Vec::new();
        };
        let fresh = || {
            self.clients
                .iter()
                .filter(move |(_, d)| now.saturating_sub(d.at) <= DEMAND_STALE)
        };
        let known: Vec<f64> = fresh().filter_map(|(_, d)| d.rate).collect();
        let unknown = if known.is_empty() {
            rate
        } else {
            known.iter().sum::<f64>() / known.len() as f64
        };
        let floor = min_share * rate;
        fresh()
            .map(|(c, d)| (c.clone(), share::weight(d.rate, floor, unknown)))
            .collect()
    }

    /// The assignment for `client` now.
    pub(super) fn assignment(
        &self,
        client: &str,
        now: Nanos,
        options: &QuotaOptions,
    ) -> Assignment {
        match &self.resolved {
            Resolved::Unmatched => match options.unmatched {
                Unmatched::Allow => Assignment::AllowAll,
                Unmatched::Deny => Assignment::DenyAll,
            },
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
                let weights = self.weights(now, options.min_share);
                let local: f64 = weights.iter().map(|(_, w)| w).sum();
                let mine = weights
                    .iter()
                    .find(|(c, _)| &**c == client)
                    .map_or(local / weights.len().max(1) as f64, |(_, w)| *w);
                let rate = *limit as f64 / *period_seconds as f64;
                let share = share::share(rate, mine, local + self.global.others);
                share::token_bucket(share, *limit, *period_seconds)
            }
        }
    }

    /// Counts `allowed` requests reported now into the window.
    pub(super) fn count(&mut self, allowed: u64, now: Nanos, shared_store: bool) {
        let Resolved::Limited {
            quota,
            period_seconds,
            ..
        } = &self.resolved
        else {
            return;
        };
        if *period_seconds < COUNTED_PERIOD_SECONDS {
            return;
        }
        let window = quota.window_at(now).index;
        if window != self.global.window {
            self.global.window = window;
            self.global.used = 0;
        }
        self.global.used = self.global.used.saturating_add(allowed);
        if shared_store {
            self.global.pending = self.global.pending.saturating_add(allowed);
        }
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
