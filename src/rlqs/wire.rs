//! The quota service's wire form: usage reports in, bucket actions out.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};

use super::bucket::bucket_name;
use super::quotas::Quotas;
use super::share::Assignment;

fn seconds(d: Duration) -> PbDuration {
    PbDuration {
        seconds: d.as_secs().max(1) as i64,
        nanos: 0,
    }
}

impl Quotas {
    /// The bucket usages of a report, each bucket once (usages of one
    /// bucket added up, the longest elapsed time kept); usages with no id,
    /// or above the bounds, are counted as refused and left out.
    pub(super) fn usages(&self, domain: &str, reports: &RateLimitQuotaUsageReports) -> Vec<Usage> {
        let mut usages: Vec<Usage> = Vec::with_capacity(reports.bucket_quota_usages.len());
        let mut seen: HashMap<Arc<str>, usize> = HashMap::new();
        for usage in &reports.bucket_quota_usages {
            self.metrics.bucket_reports.fetch_add(1, Ordering::Relaxed);
            let Some(entries) = usage.bucket_id.as_ref().and_then(|b| self.entries(b)) else {
                self.metrics.buckets_refused.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let elapsed = usage.time_elapsed.as_ref().map_or(0.0, |d| {
                d.seconds.max(0) as f64 + f64::from(d.nanos.clamp(0, 999_999_999)) / 1e9
            });
            let name = bucket_name(domain, &entries);
            match seen.get(&name) {
                Some(&i) => {
                    let merged = &mut usages[i];
                    merged.allowed = merged.allowed.saturating_add(usage.num_requests_allowed);
                    merged.denied = merged.denied.saturating_add(usage.num_requests_denied);
                    merged.elapsed = merged.elapsed.max(elapsed);
                }
                None => {
                    seen.insert(name.clone(), usages.len());
                    usages.push(Usage {
                        name,
                        entries,
                        allowed: usage.num_requests_allowed,
                        denied: usage.num_requests_denied,
                        elapsed,
                    });
                }
            }
        }
        usages
    }

    /// A bucket id's entries, sorted by key; `None` when it is empty or
    /// above the bounds.
    fn entries(&self, id: &BucketId) -> Option<Vec<(String, String)>> {
        if id.bucket.is_empty() || id.bucket.len() > self.options.max_entries {
            return None;
        }
        let max = self.options.max_value_bytes;
        if id
            .bucket
            .iter()
            .any(|(k, v)| k.len() > max || v.len() > max)
        {
            return None;
        }
        let mut entries: Vec<(String, String)> = id
            .bucket
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        entries.sort_unstable();
        Some(entries)
    }

    /// The wire form of an assignment for bucket `id`.
    pub(super) fn action(
        &self,
        entries: &[(String, String)],
        assignment: &Assignment,
    ) -> BucketAction {
        let strategy = match *assignment {
            Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_seconds,
                ..
            } => Strategy::TokenBucket(TokenBucket {
                max_tokens,
                tokens_per_fill: Some(UInt32Value {
                    value: tokens_per_fill,
                }),
                fill_interval: Some(PbDuration {
                    seconds: i64::from(fill_seconds),
                    nanos: 0,
                }),
            }),
        };
        let sent = &self.metrics.assignments;
        let counter = match assignment {
            Assignment::TokenBucket { .. } => &sent.token_bucket,
            Assignment::AllowAll => &sent.allow_all,
            Assignment::DenyAll => &sent.deny_all,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        BucketAction {
            bucket_id: Some(bucket_id(entries)),
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(seconds(self.options.assignment_ttl)),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })),
        }
    }

    pub(super) fn abandon(&self, entries: &[(String, String)]) -> BucketAction {
        self.metrics
            .assignments
            .abandon
            .fetch_add(1, Ordering::Relaxed);
        BucketAction {
            bucket_id: Some(bucket_id(entries)),
            bucket_action: Some(Action::AbandonAction(AbandonAction {})),
        }
    }
}

/// The wire form of a bucket's entries.
fn bucket_id(entries: &[(String, String)]) -> BucketId {
    BucketId {
        bucket: entries.iter().cloned().collect(),
    }
}

/// One bucket's usage in a report, its duplicates merged.
#[derive(Debug)]
pub(super) struct Usage {
    /// The bucket's canonical name.
    pub(super) name: Arc<str>,
    /// Sorted by key.
    pub(super) entries: Vec<(String, String)>,
    pub(super) allowed: u64,
    pub(super) denied: u64,
    /// Seconds the usage covers.
    pub(super) elapsed: f64,
}
