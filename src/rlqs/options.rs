//! Settings and bounds of the quota service.

use std::time::Duration;

use crate::clock::{NANOS_PER_SEC, Nanos};

/// How long a client's demand counts after its last report: three of
/// Envoy's report intervals (5 s in Envoy 1.40), so one lost report does
/// not change the shares.
pub(crate) const DEMAND_STALE: Nanos = 15 * NANOS_PER_SEC;

/// Periods at least this long are also counted: once a window's admitted
/// requests (as reported, from every instance) reach the limit, the bucket
/// is denied until the window ends. Shorter periods are enforced by the
/// token buckets' rate alone: reports arrive every 5 seconds, too coarse to
/// count a one-second window.
pub(crate) const COUNTED_PERIOD_SECONDS: u64 = 60;

/// The most named clients whose demand one bucket keeps after their stream
/// ended (for 15 s, pooled): names cycled by one client cannot grow a
/// bucket without limit. Live streams are bounded by `max_streams`.
pub(crate) const MAX_DEPARTED: usize = 4096;

/// The longest client name kept (characters); longer names are cut.
pub(crate) const MAX_CLIENT_NAME: usize = 256;

/// Settings of the quota service.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct QuotaOptions {
    /// How long Envoy keeps an assignment without hearing from Tollgate
    /// (whole seconds, as Envoy counts them).
    pub assignment_ttl: Duration,
    /// The least weight of a client, as a share of the bucket's rate.
    pub min_share: f64,
    /// What buckets that match no limit get.
    pub(crate) unmatched: Unmatched,
    /// The most buckets tracked at once; reports for more are not answered.
    pub max_buckets: usize,
    /// The most streams open at once (all connections); more are refused.
    pub max_streams: usize,
    /// Entries per bucket id, and bytes per key or value.
    pub max_entries: usize,
    /// Bytes of one bucket key or value, and of the domain.
    pub max_value_bytes: usize,
    /// The most bytes the buckets' names and entries take, all buckets
    /// together (values up to `max_value_bytes` make the count alone a
    /// poor bound); reports for more are not answered.
    pub max_bucket_bytes: usize,
    /// The most buckets one stream holds at once; reports for more are not
    /// answered.
    pub max_buckets_per_stream: usize,
    /// The most (stream, bucket) pairs held at once, all streams together:
    /// what the tables grow with (770 to 1,200 bytes of RSS each, measured).
    pub max_pairs: usize,
    /// Bytes of answers and pushes a stream may have waiting; a stream that
    /// does not read past it is ended (RESOURCE_EXHAUSTED).
    pub max_queued_bytes: usize,
    /// How long a stream may go without a usage report before it is ended
    /// (DEADLINE_EXCEEDED); longer than Envoy's `reporting_interval`.
    pub idle_timeout: Duration,
    /// How long the once-a-second exchange with the store may take, all
    /// buckets together.
    pub exchange_timeout: Duration,
    /// This instance's name in the shared store.
    pub instance: String,
}

impl Default for QuotaOptions {
    fn default() -> Self {
        Self {
            assignment_ttl: Duration::from_secs(15),
            min_share: 0.05,
            unmatched: Unmatched::Allow,
            max_buckets: 100_000,
            max_streams: 10_000,
            max_bucket_bytes: 64 * 1024 * 1024,
            max_buckets_per_stream: 10_000,
            max_pairs: 500_000,
            exchange_timeout: Duration::from_millis(500),
            max_queued_bytes: 1024 * 1024,
            idle_timeout: Duration::from_secs(60),
            max_entries: 32,
            max_value_bytes: 65_536,
            instance: "tollgate".into(),
        }
    }
}

/// The answer for buckets that match no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unmatched {
    /// Allow all their requests.
    Allow,
    /// Deny all their requests.
    Deny,
}
