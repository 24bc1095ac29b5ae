//! What the quota service is told and tells, in its own terms: a report's
//! usage per bucket in, and per bucket an
//! assignment or an abandon. A bucket's entries are shared with the bucket
//! itself, so an answer waiting for a stream that does not read holds a
//! pointer and a few numbers per bucket, not a copy of every bucket id; it
//! becomes the wire form (`wire.rs`) only when the stream sends it.

use std::sync::Arc;
use std::time::Duration;

use super::share::Assignment;

/// A bucket's entries, sorted by key: shared by the bucket and every
/// answer that names it.
pub(super) type Entries = Arc<[(String, String)]>;

/// What a stream is told about one bucket.
#[derive(Debug, Clone)]
pub(super) struct Action {
    pub(super) bucket: Entries,
    pub(super) kind: ActionKind,
}

/// An assignment (for `ttl`), or the bucket is abandoned.
#[derive(Debug, Clone)]
pub(super) enum ActionKind {
    Assign(Assignment),
    Abandon,
}

/// One message to a stream.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct Answer {
    pub(super) actions: Vec<Action>,
    /// How long the assignments stand (`--rlqs-assignment-ttl`).
    pub(super) ttl: Duration,
}

impl Answer {
    /// No action yet; assignments stand for `ttl`.
    pub(super) fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            actions: Vec::with_capacity(capacity),
            ttl,
        }
    }
}

/// One bucket's usage in a report, its duplicates merged.
#[derive(Debug)]
pub(super) struct Usage {
    /// The bucket's canonical name.
    pub(super) name: Arc<str>,
    /// Sorted by key.
    pub(super) entries: Entries,
    pub(super) allowed: u64,
    pub(super) denied: u64,
    /// Seconds the usage covers.
    pub(super) elapsed: f64,
}
