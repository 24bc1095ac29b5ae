//! The quota service's metrics (`tollgate_rlqs_*`): names, help and lines.
//! The numbers come from [`crate::rlqs`] as an [`RlqsMetrics`].

use super::exposition::{Exposition, Kind};
use super::labels;

/// What the quota service reports, read at one moment.
#[derive(Debug, Default)]
pub(crate) struct RlqsMetrics {
    pub streams: usize,
    pub buckets: usize,
    pub bucket_bytes: usize,
    pub pairs: usize,
    pub streams_opened: u64,
    pub reports: u64,
    pub bucket_reports: u64,
    pub buckets_refused: u64,
    pub streams_ended: u64,
    pub store_errors: u64,
    /// Assignments made for streams, by action.
    pub assignments: Assignments,
    /// Per (domain, rule): requests Envoy reported allowed and denied.
    pub requests: Vec<RuleRequests>,
    /// Per (domain, rule): this instance's clients' demand (requests per
    /// second) and what every instance admitted in the current window.
    pub usage: Vec<RuleUsage>,
}

/// Assignments made for streams, by action.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Assignments {
    pub token_bucket: u64,
    pub allow_all: u64,
    pub deny_all: u64,
    pub abandon: u64,
}

/// Requests Envoy reported for one rule.
#[derive(Debug)]
pub(crate) struct RuleRequests {
    pub domain: String,
    pub rule: String,
    pub allowed: u64,
    pub denied: u64,
}

/// One rule's demand and use.
#[derive(Debug)]
pub(crate) struct RuleUsage {
    pub domain: String,
    pub rule: String,
    pub demand: f64,
    pub window_used: u64,
}

fn rule_labels(domain: &str, rule: &str) -> String {
    labels([("domain", domain), ("rule", rule)])
}

/// Writes the quota service's families.
pub(crate) fn render(out: &mut Exposition<'_>, m: &RlqsMetrics) {
    out.gauge("tollgate_rlqs_streams", "Open quota streams.", m.streams)
        .gauge(
            "tollgate_rlqs_buckets",
            "Quota buckets tracked.",
            m.buckets,
        )
        .gauge(
            "tollgate_rlqs_bucket_bytes",
            "Bytes the tracked buckets' names and entries take (--rlqs-max-bucket-bytes).",
            m.bucket_bytes,
        )
        .gauge(
            "tollgate_rlqs_pairs",
            "(stream, bucket) pairs held (--rlqs-max-pairs).",
            m.pairs,
        )
        .counter(
            "tollgate_rlqs_streams_opened_total",
            "Quota streams opened.",
            m.streams_opened,
        )
        .counter(
            "tollgate_rlqs_reports_total",
            "Usage report messages received.",
            m.reports,
        )
        .counter(
            "tollgate_rlqs_bucket_reports_total",
            "Bucket usages received.",
            m.bucket_reports,
        )
        .counter(
            "tollgate_rlqs_buckets_refused_total",
            "Bucket usages not answered: empty id, above --max-entries or --max-value-bytes, or past --rlqs-max-buckets, --rlqs-max-buckets-per-stream or --rlqs-max-pairs.",
            m.buckets_refused,
        )
        .counter(
            "tollgate_rlqs_streams_ended_total",
            "Quota streams ended for not reading their answers (--rlqs-max-queued-bytes).",
            m.streams_ended,
        )
        .counter(
            "tollgate_rlqs_store_errors_total",
            "Failed exchanges with the store.",
            m.store_errors,
        );
    let name = "tollgate_rlqs_assignments_total";
    out.family(
        name,
        "Assignments made for streams, by action.",
        Kind::Counter,
    );
    let a = m.assignments;
    for (action, n) in [
        ("token_bucket", a.token_bucket),
        ("allow_all", a.allow_all),
        ("deny_all", a.deny_all),
        ("abandon", a.abandon),
    ] {
        out.sample(name, &format!("action=\"{action}\""), n);
    }
    let name = "tollgate_rlqs_requests_total";
    out.family(
        name,
        "Requests Envoy reported, per rule and result.",
        Kind::Counter,
    );
    for r in &m.requests {
        let labels = rule_labels(&r.domain, &r.rule);
        for (result, n) in [("allowed", r.allowed), ("denied", r.denied)] {
            out.sample(name, &format!("{labels},result=\"{result}\""), n);
        }
    }
    let name = "tollgate_rlqs_demand";
    out.family(
        name,
        "Requests per second this instance's clients reported, per rule.",
        Kind::Gauge,
    );
    for u in &m.usage {
        out.sample(name, &rule_labels(&u.domain, &u.rule), u.demand);
    }
    let name = "tollgate_rlqs_window_used";
    out.family(
        name,
        "Requests admitted in the current window by every instance, per rule (periods of a minute or more).",
        Kind::Gauge,
    );
    for u in &m.usage {
        out.sample(name, &rule_labels(&u.domain, &u.rule), u.window_used);
    }
}
