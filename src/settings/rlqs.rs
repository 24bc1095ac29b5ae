//! The quota service's (RLQS) flags.

use std::time::Duration;

use clap::Args;

use super::values::{UnmatchedArg, at_least_one, parse_duration, parse_share, parse_ttl};

/// Settings of the quota service (RLQS). Each keeps its `--rlqs-` flag
/// name (and id) from when the fields were `ServeArgs`' own.
#[derive(Debug, Clone, Args)]
pub(crate) struct RlqsArgs {
    /// Quota service (RLQS): how long Envoy keeps an assignment without
    /// hearing from Tollgate before its `expired_assignment_behavior`
    /// applies; whole seconds, longer than Envoy's report interval (5 s).
    #[arg(id = "rlqs_assignment_ttl", value_name = "RLQS_ASSIGNMENT_TTL", long = "rlqs-assignment-ttl", env = "TOLLGATE_RLQS_ASSIGNMENT_TTL", default_value = "15s", value_parser = parse_ttl)]
    pub assignment_ttl: Duration,

    /// Quota service: the least share of a bucket's rate an Envoy that
    /// reports it is weighed with, so an idle Envoy can start again at once.
    #[arg(id = "rlqs_min_share", value_name = "RLQS_MIN_SHARE", long = "rlqs-min-share", env = "TOLLGATE_RLQS_MIN_SHARE", default_value_t = 0.05, value_parser = parse_share)]
    pub min_share: f64,

    /// Quota service: what buckets that match no limit are told.
    #[arg(id = "rlqs_unmatched", value_name = "RLQS_UNMATCHED", long = "rlqs-unmatched", env = "TOLLGATE_RLQS_UNMATCHED", value_enum, default_value_t = UnmatchedArg::AllowAll)]
    pub unmatched: UnmatchedArg,

    /// Quota service: the most buckets tracked at once; usage for more is
    /// not answered (Envoy keeps its no-assignment behaviour for them).
    #[arg(id = "rlqs_max_buckets", value_name = "RLQS_MAX_BUCKETS", long = "rlqs-max-buckets", env = "TOLLGATE_RLQS_MAX_BUCKETS", default_value_t = 100_000, value_parser = at_least_one)]
    pub max_buckets: usize,

    /// Quota service: the most streams open at once (one per Envoy and
    /// domain); more are refused with RESOURCE_EXHAUSTED.
    #[arg(id = "rlqs_max_streams", value_name = "RLQS_MAX_STREAMS", long = "rlqs-max-streams", env = "TOLLGATE_RLQS_MAX_STREAMS", default_value_t = 10_000, value_parser = at_least_one)]
    pub max_streams: usize,

    /// Quota service: the most bytes the tracked buckets' names and entries
    /// take, all together; usage for more is not answered.
    #[arg(id = "rlqs_max_bucket_bytes", value_name = "RLQS_MAX_BUCKET_BYTES", long = "rlqs-max-bucket-bytes", env = "TOLLGATE_RLQS_MAX_BUCKET_BYTES", default_value_t = 64 * 1024 * 1024, value_parser = at_least_one)]
    pub max_bucket_bytes: usize,

    /// Quota service: the most buckets one stream holds at once; usage for
    /// more is not answered.
    #[arg(id = "rlqs_max_buckets_per_stream", value_name = "RLQS_MAX_BUCKETS_PER_STREAM", long = "rlqs-max-buckets-per-stream", env = "TOLLGATE_RLQS_MAX_BUCKETS_PER_STREAM", default_value_t = 10_000, value_parser = at_least_one)]
    pub max_buckets_per_stream: usize,

    /// Quota service: the most (stream, bucket) pairs held at once, every
    /// stream together (what memory grows with: 770 to 1,200 bytes of RSS each,
    /// measured with 200,000).
    #[arg(id = "rlqs_max_pairs", value_name = "RLQS_MAX_PAIRS", long = "rlqs-max-pairs", env = "TOLLGATE_RLQS_MAX_PAIRS", default_value_t = 500_000, value_parser = at_least_one)]
    pub max_pairs: usize,

    /// Quota service: how long the once-a-second exchange with Redis may
    /// take, every bucket together (separate from --redis-timeout).
    #[arg(id = "rlqs_exchange_timeout", value_name = "RLQS_EXCHANGE_TIMEOUT", long = "rlqs-exchange-timeout", env = "TOLLGATE_RLQS_EXCHANGE_TIMEOUT", default_value = "500ms", value_parser = parse_duration)]
    pub exchange_timeout: Duration,

    /// Quota service: bytes (wire size) of answers a stream may have
    /// waiting to be read, merged per bucket; a stream that does not read
    /// past it is ended.
    #[arg(id = "rlqs_max_queued_bytes", value_name = "RLQS_MAX_QUEUED_BYTES", long = "rlqs-max-queued-bytes", env = "TOLLGATE_RLQS_MAX_QUEUED_BYTES", default_value_t = 1024 * 1024, value_parser = at_least_one)]
    pub max_queued_bytes: usize,

    /// Quota service: how long a stream may go without a usage report
    /// before it is ended; longer than Envoy's `reporting_interval`.
    #[arg(id = "rlqs_idle_timeout", value_name = "RLQS_IDLE_TIMEOUT", long = "rlqs-idle-timeout", env = "TOLLGATE_RLQS_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
}

impl RlqsArgs {
    /// The quota service's options; request bounds are the gRPC ones
    /// (`--max-entries`, `--max-value-bytes`), `instance` this process's
    /// name among those sharing the store.
    pub(crate) fn quota_options(
        &self,
        max_entries: usize,
        max_value_bytes: usize,
        instance: String,
    ) -> crate::rlqs::QuotaOptions {
        crate::rlqs::QuotaOptions {
            assignment_ttl: self.assignment_ttl,
            min_share: self.min_share,
            unmatched: match self.unmatched {
                UnmatchedArg::AllowAll => crate::rlqs::Unmatched::Allow,
                UnmatchedArg::DenyAll => crate::rlqs::Unmatched::Deny,
            },
            max_buckets: self.max_buckets,
            max_streams: self.max_streams,
            max_bucket_bytes: self.max_bucket_bytes,
            max_buckets_per_stream: self.max_buckets_per_stream,
            max_pairs: self.max_pairs,
            exchange_timeout: self.exchange_timeout,
            max_queued_bytes: self.max_queued_bytes,
            idle_timeout: self.idle_timeout,
            max_entries,
            max_value_bytes,
            instance,
        }
    }
}
