//! The quota service's wire form: usage reports in, bucket actions out
//! (made from an [`Answer`] when a stream sends it).

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
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};

use super::answer::{Action as Act, ActionKind, Answer, Entries, Usage};
use super::bucket::bucket_name;
use super::error::QuotaError;
use super::quotas::Quotas;
use super::share::Assignment;

fn seconds(d: Duration) -> PbDuration {
    PbDuration {
        seconds: d.as_secs().max(1) as i64,
        nanos: 0,
    }
}

impl Quotas {
    /// Answers stream `id`'s usage report as it came off the wire: its
    /// domain checked, its usages read (each bucket once), decided now.
    #[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
    pub fn answer(
        &self,
        id: u64,
        reports: &RateLimitQuotaUsageReports,
    ) -> Result<Answer, QuotaError> {
        self.metrics.reports.fetch_add(1, Ordering::Relaxed);
        let domain = reports.domain.as_str();
        self.check_domain(domain)?;
        let usages = self.usages(domain, reports);
        self.report(id, domain, usages, self.now())
    }

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
    fn entries(&self, id: &BucketId) -> Option<Entries> {
        if id.bucket.is_empty() || id.bucket.len() > self.options.max_entries {
            return None;
        }
        let max = self.options.max_value_bytes;
        // Bytes as sent (a text that was not UTF-8 is up to four times
        // longer once made text): no easier to exceed with such bytes.
        let over = |text: &str| crate::wire_text::wire_len_over(text, max).is_some();
        if id.bucket.iter().any(|(k, v)| over(k) || over(v)) {
            return None;
        }
        let mut entries: Vec<(String, String)> = id
            .bucket
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        entries.sort_unstable();
        Some(entries.into())
    }
}

impl Answer {
    /// The wire form, made when the stream sends it.
    #[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
    pub fn into_wire(self) -> RateLimitQuotaResponse {
        let ttl = self.ttl;
        RateLimitQuotaResponse {
            bucket_action: self
                .actions
                .iter()
                .map(|a| BucketAction {
                    bucket_id: Some(BucketId {
                        bucket: a.bucket.iter().cloned().collect(),
                    }),
                    bucket_action: Some(wire_action(&a.kind, ttl)),
                })
                .collect(),
        }
    }

    /// The size of its wire form, in bytes, computed without making it.
    #[cfg(test)]
    pub(super) fn encoded_len(&self) -> usize {
        self.actions.iter().map(|a| a.encoded_len(self.ttl)).sum()
    }
}

impl Act {
    /// The size of its part of an answer's wire form (assignments standing
    /// for `ttl`), computed without making it.
    pub(super) fn encoded_len(&self, ttl: Duration) -> usize {
        use prost::Message;
        use prost::encoding::encoded_len_varint as varint;
        let field = |len: usize| 1 + varint(len as u64) + len;
        let string = |s: &str| if s.is_empty() { 0 } else { field(s.len()) };
        let id: usize = self
            .bucket
            .iter()
            .map(|(k, v)| field(string(k) + string(v)))
            .sum();
        let action = BucketAction {
            bucket_id: None,
            bucket_action: Some(wire_action(&self.kind, ttl)),
        }
        .encoded_len();
        field(field(id) + action)
    }
}

/// The wire form of an action (without its bucket id).
fn wire_action(kind: &ActionKind, ttl: Duration) -> Action {
    let assignment = match kind {
        ActionKind::Abandon => return Action::AbandonAction(AbandonAction {}),
        ActionKind::Assign(assignment) => assignment,
    };
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
    Action::QuotaAssignmentAction(QuotaAssignmentAction {
        assignment_time_to_live: Some(seconds(ttl)),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rlqs::answer::Action;

    #[test]
    fn an_answers_size_is_its_wire_forms_without_making_it() {
        let entries = |pairs: &[(&str, &str)]| -> Entries {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<Vec<_>>()
                .into()
        };
        let long = "v".repeat(300);
        let bucket = |e: Entries, kind: ActionKind| Action { bucket: e, kind };
        let token_bucket = Assignment::TokenBucket {
            share: 5.0,
            max_tokens: 10,
            tokens_per_fill: 5,
            fill_seconds: 1,
        };
        let answer = Answer {
            actions: vec![
                bucket(
                    entries(&[("api_key", "k")]),
                    ActionKind::Assign(token_bucket),
                ),
                bucket(
                    entries(&[("a", ""), ("", "v")]),
                    ActionKind::Assign(Assignment::AllowAll),
                ),
                bucket(
                    entries(&[("k", &long), ("x", "y")]),
                    ActionKind::Assign(Assignment::DenyAll),
                ),
                bucket(entries(&[("gone", "1")]), ActionKind::Abandon),
            ],
            ttl: Duration::from_secs(15),
        };
        let wire = prost::Message::encoded_len(&answer.clone().into_wire());
        assert!(wire > 300, "the long value is in it ({wire} bytes)");
        assert_eq!(answer.encoded_len(), wire);
        assert_eq!(
            Answer {
                actions: Vec::new(),
                ttl: Duration::from_secs(1)
            }
            .encoded_len(),
            0
        );
    }
}
