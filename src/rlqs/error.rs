//! Why the quota service refuses a stream or a report, in its own terms;
//! the gRPC service maps each to a status (`mod.rs`).

/// A stream or report the quota service refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub enum QuotaError {
    /// `--rlqs-max-streams` streams are open.
    #[error("{open} quota streams are open, the most allowed (--rlqs-max-streams)")]
    TooManyStreams {
        /// Streams open.
        open: usize,
    },
    /// A report names no domain.
    #[error("usage reports without a domain")]
    NoDomain,
    /// A report's domain is longer than `--max-value-bytes`.
    #[error("domain of {bytes} bytes is above the bound of {max} (--max-value-bytes)")]
    DomainTooLong {
        /// Its length.
        bytes: usize,
        /// The bound.
        max: usize,
    },
    /// A stream's report is for another domain than its first.
    #[error(
        "a stream carries one domain: it started with '{started}', this report is for '{this}'"
    )]
    OtherDomain {
        /// The stream's domain.
        started: String,
        /// The report's.
        this: String,
    },
    /// The stream was closed meanwhile.
    #[error("stream closed")]
    StreamClosed,
}
