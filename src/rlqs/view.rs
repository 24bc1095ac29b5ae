//! What operators see of the quota service: its numbers for `/metrics`
//! (named and written in `crate::metrics::rlqs`) and the JSON view of its
//! buckets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::bucket::{Demand, Member, Resolved};
use super::options::DEMAND_STALE;
use super::quotas::Quotas;
use super::share::{Assignment, Claim};
use crate::clock::NANOS_PER_SEC;
use crate::metrics::rlqs::{Assignments, RlqsMetrics, RuleRequests, RuleUsage};

impl Quotas {
    /// The quota service's numbers for `/metrics` (rendered by
    /// [`crate::metrics::rlqs`]).
    pub(crate) fn metrics_snapshot(&self) -> RlqsMetrics {
        let now = self.now();
        let state = self.state.lock();
        let m = &self.metrics;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let requests = state
            .per_rule
            .iter()
            .map(|((domain, rule), c)| RuleRequests {
                domain: domain.clone(),
                rule: rule.clone(),
                allowed: c.allowed,
                denied: c.denied,
            })
            .collect();
        // Global usage per rule: every instance's demand, and what was
        // admitted in the current window (counted periods only).
        let mut usage: BTreeMap<(&str, &str), (f64, u64)> = BTreeMap::new();
        for bucket in state.buckets.values() {
            let Some(rule) = bucket.resolved.rule() else {
                continue;
            };
            let local: f64 = bucket
                .members
                .values()
                .map(|m| m.demand)
                .filter(|d| now.saturating_sub(d.at) <= DEMAND_STALE)
                .filter_map(|d| d.rate)
                .sum();
            let entry = usage.entry((&bucket.domain, &rule.path)).or_default();
            entry.0 += local;
            entry.1 += bucket.global.used;
        }
        RlqsMetrics {
            streams: state.streams.len(),
            buckets: state.buckets.len(),
            bucket_bytes: state.bucket_bytes,
            pairs: state.pairs,
            streams_opened: load(&m.streams_opened),
            reports: load(&m.reports),
            bucket_reports: load(&m.bucket_reports),
            buckets_refused: load(&m.buckets_refused),
            streams_ended: load(&m.streams_ended),
            store_errors: load(&m.store_errors),
            assignments: Assignments {
                token_bucket: load(&m.assignments.token_bucket),
                allow_all: load(&m.assignments.allow_all),
                deny_all: load(&m.assignments.deny_all),
                abandon: load(&m.assignments.abandon),
            },
            requests,
            usage: usage
                .into_iter()
                .map(|((domain, rule), (demand, window_used))| RuleUsage {
                    domain: domain.to_owned(),
                    rule: rule.to_owned(),
                    demand,
                    window_used,
                })
                .collect(),
        }
    }

    /// The current assignments as JSON, at most `limit` buckets (sorted by
    /// domain and entries).
    pub(crate) fn to_json(&self, limit: usize) -> serde_json::Value {
        use serde_json::json;
        let now = self.now();
        let state = self.state.lock();
        let mut names: Vec<&Arc<str>> = state.buckets.keys().collect();
        names.sort();
        let buckets: Vec<serde_json::Value> = names
            .iter()
            .take(limit)
            .map(|name| {
                let b = &state.buckets[*name];
                let client = |label: String, d: &Demand, live: bool| {
                    json!({
                        "client": label,
                        "demand_per_second": d.rate,
                        "reported_seconds_ago": now.saturating_sub(d.at) / NANOS_PER_SEC,
                        "weight": b.rate().map(|_| b.split.weight(Claim { demand: d.rate, live })),
                        "live": live,
                    })
                };
                let label = |id: &u64| {
                    state
                        .streams
                        .get(id)
                        .map_or_else(|| format!("stream-{id}"), |s| s.label.to_string())
                };
                let mut members: Vec<(&u64, &Member)> = b.members.iter().collect();
                members.sort_by_key(|(id, _)| **id);
                let mut clients: Vec<serde_json::Value> = members
                    .iter()
                    .map(|(id, m)| client(label(id), &m.demand, true))
                    .collect();
                clients.extend(
                    b.departed
                        .iter()
                        .map(|(name, d)| client(name.to_string(), d, false)),
                );
                let mut assignments: Vec<(u64, serde_json::Value)> = members
                    .iter()
                    .filter_map(|(id, m)| {
                        let a = m.sent.as_ref()?;
                        Some((**id, json!({"stream": id, "client": label(id), "assignment": assignment_json(a)})))
                    })
                    .collect();
                assignments.sort_by_key(|(id, _)| *id);
                let entries: serde_json::Map<String, serde_json::Value> = b
                    .entries
                    .iter()
                    .map(|(k, v)| (k.clone(), json!(v)))
                    .collect();
                let (rule, limit) = match &b.resolved {
                    Resolved::Unmatched => (None, json!(null)),
                    Resolved::Unlimited(r) => (Some(r.path.clone()), json!("unlimited")),
                    Resolved::Limited {
                        rule,
                        limit,
                        period_seconds,
                        ..
                    } => (
                        Some(rule.path.clone()),
                        json!({
                            "requests": limit,
                            "period_seconds": period_seconds,
                            "per_second": *limit as f64 / *period_seconds as f64,
                        }),
                    ),
                };
                json!({
                    "domain": b.domain,
                    "bucket": entries,
                    "rule": rule,
                    "limit": limit,
                    "other_instances_weight": b.global.others,
                    "window_used": b.global.used,
                    "clients": clients,
                    "assignments": assignments.into_iter().map(|(_, a)| a).collect::<Vec<_>>(),
                })
            })
            .collect();
        let streams: Vec<serde_json::Value> = {
            let mut ids: Vec<&u64> = state.streams.keys().collect();
            ids.sort();
            ids.into_iter()
                .map(|id| {
                    let s = &state.streams[id];
                    json!({"stream": id, "client": &*s.label, "named": s.name.is_some(), "domain": s.domain, "buckets": s.buckets.len()})
                })
                .collect()
        };
        json!({
            "instance": self.options.instance,
            "buckets_total": state.buckets.len(),
            "pairs": state.pairs,
            "bucket_bytes": state.bucket_bytes,
            "buckets": buckets,
            "streams": streams,
        })
    }
}

fn assignment_json(a: &Assignment) -> serde_json::Value {
    use serde_json::json;
    match a {
        Assignment::AllowAll => json!({"blanket_rule": "ALLOW_ALL"}),
        Assignment::DenyAll => json!({"blanket_rule": "DENY_ALL"}),
        Assignment::TokenBucket {
            share,
            max_tokens,
            tokens_per_fill,
            fill_seconds,
        } => json!({"token_bucket": {
            "share_per_second": share,
            "max_tokens": max_tokens,
            "tokens_per_fill": tokens_per_fill,
            "fill_interval_seconds": fill_seconds,
        }}),
    }
}
