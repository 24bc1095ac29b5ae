//! The quota service's wire form: usage reports in, bucket actions out.

use std::sync::atomic::Ordering;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaResponse};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use tonic::Status;

use super::quotas::Quotas;
use super::share::Assignment;

/// What a stream receives.
pub type Outgoing = Result<RateLimitQuotaResponse, Status>;

fn seconds(d: Duration) -> PbDuration {
    PbDuration {
        seconds: d.as_secs().max(1) as i64,
        nanos: 0,
    }
}

impl Quotas {
    /// A bucket id's entries, sorted by key; `None` when it is empty or
    /// above the bounds.
    pub(super) fn entries(&self, id: &BucketId) -> Option<Vec<(String, String)>> {
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
        let kind = match assignment {
            Assignment::TokenBucket { .. } => 0,
            Assignment::AllowAll => 1,
            Assignment::DenyAll => 2,
        };
        self.metrics.assignments[kind].fetch_add(1, Ordering::Relaxed);
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
        self.metrics.assignments[3].fetch_add(1, Ordering::Relaxed);
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
