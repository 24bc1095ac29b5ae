//! What operators see of the quota service: its Prometheus lines and the
//! JSON view of its buckets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::bucket::{Demand, Member, Resolved};
use super::options::DEMAND_STALE;
use super::quotas::Quotas;
use super::share::{Assignment, Claim};
use crate::clock::NANOS_PER_SEC;

impl Quotas {
    /// The Prometheus lines of the quota service.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let now = self.now();
        let state = self.state.lock();
        let m = &self.metrics;
        let gauge = |out: &mut String, name: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        gauge(
            out,
            "tollgate_rlqs_streams",
            "Open quota streams.",
            state.streams.len() as f64,
        );
        gauge(
            out,
            "tollgate_rlqs_buckets",
            "Quota buckets tracked.",
            state.buckets.len() as f64,
        );
        gauge(
            out,
            "tollgate_rlqs_bucket_bytes",
            "Bytes the tracked buckets' names and entries take (--rlqs-max-bucket-bytes).",
            state.bucket_bytes as f64,
        );
        gauge(
            out,
            "tollgate_rlqs_pairs",
            "(stream, bucket) pairs held (--rlqs-max-pairs).",
            state.pairs as f64,
        );
        let counters = [
            (
                "tollgate_rlqs_streams_opened_total",
                "Quota streams opened.",
                &m.streams_opened,
            ),
            (
                "tollgate_rlqs_reports_total",
                "Usage report messages received.",
                &m.reports,
            ),
            (
                "tollgate_rlqs_bucket_reports_total",
                "Bucket usages received.",
                &m.bucket_reports,
            ),
            (
                "tollgate_rlqs_buckets_refused_total",
                "Bucket usages not answered: empty id, above --max-entries or --max-value-bytes, or past --rlqs-max-buckets, --rlqs-max-buckets-per-stream or --rlqs-max-pairs.",
                &m.buckets_refused,
            ),
            (
                "tollgate_rlqs_streams_ended_total",
                "Quota streams ended for not reading their answers (--rlqs-max-queued-bytes).",
                &m.streams_ended,
            ),
            (
                "tollgate_rlqs_store_errors_total",
                "Failed exchanges with the store.",
                &m.store_errors,
            ),
        ];
        for (name, help, value) in counters {
            counter(out, name, help, value.load(Ordering::Relaxed));
        }
        let _ = writeln!(
            out,
            "# HELP tollgate_rlqs_assignments_total Assignments sent, by action.\n# TYPE tollgate_rlqs_assignments_total counter"
        );
        for (i, action) in ["token_bucket", "allow_all", "deny_all", "abandon"]
            .iter()
            .enumerate()
        {
            let _ = writeln!(
                out,
                "tollgate_rlqs_assignments_total{{action=\"{action}\"}} {}",
                m.assignments[i].load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP tollgate_rlqs_requests_total Requests Envoy reported, per rule and result.\n# TYPE tollgate_rlqs_requests_total counter"
        );
        for ((domain, rule), c) in &state.per_rule {
            for (result, value) in [("allowed", c.allowed), ("denied", c.denied)] {
                let labels = rule_labels(domain, rule);
                let _ = writeln!(
                    out,
                    "tollgate_rlqs_requests_total{{{labels},result=\"{result}\"}} {value}"
                );
            }
        }
        // Global usage per rule: every instance's demand, and what was
        // admitted in the current window (counted periods only).
        let mut demand: BTreeMap<(&str, &str), (f64, u64)> = BTreeMap::new();
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
            let entry = demand.entry((&bucket.domain, &rule.path)).or_default();
            entry.0 += local;
            entry.1 += bucket.global.used;
        }
        // (name, help, value of one rule's (demand, used))
        type Series = (&'static str, &'static str, fn(&(f64, u64)) -> String);
        let per_rule: [Series; 2] = [
            (
                "tollgate_rlqs_demand",
                "Requests per second this instance's clients reported, per rule.",
                |(rate, _)| rate.to_string(),
            ),
            (
                "tollgate_rlqs_window_used",
                "Requests admitted in the current window by every instance, per rule (periods of a minute or more).",
                |(_, used)| used.to_string(),
            ),
        ];
        for (name, help, value) in per_rule {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for ((domain, rule), v) in &demand {
                let labels = rule_labels(domain, rule);
                let _ = writeln!(out, "{name}{{{labels}}} {}", value(v));
            }
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

/// `domain="…",rule="…"`, escaped.
fn rule_labels(domain: &str, rule: &str) -> String {
    let mut labels = String::new();
    crate::metrics::push_label(&mut labels, "domain", domain);
    crate::metrics::push_label(&mut labels, "rule", rule);
    labels.split_off(1)
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
