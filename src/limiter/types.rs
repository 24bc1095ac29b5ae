//! The limiter's vocabulary: a request and its descriptors, the decision
//! and each descriptor's status, and why a request could not be decided.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::clock::Nanos;
use crate::rules::Unit;
use crate::store::StoreError;

/// A rate limit request, borrowed from the wire.
#[derive(Debug, Default)]
pub struct Request<'a> {
    /// The rule domain.
    pub domain: &'a str,
    /// The descriptors, in request order.
    pub descriptors: SmallVec<[Descriptor<'a>; 4]>,
    /// Request-level hits (0 means 1).
    pub hits_addend: u32,
}

/// One descriptor: ordered entries, and optional per-descriptor settings.
#[derive(Debug, Default)]
pub struct Descriptor<'a> {
    /// `(key, value)` entries in order.
    pub entries: SmallVec<[(&'a str, &'a str); 4]>,
    /// A limit sent by Envoy that replaces the configured one.
    pub limit_override: Option<LimitOverride>,
    /// Per-descriptor hits; wins over the request's when set (0: check only).
    pub hits_addend: Option<u64>,
}

/// A limit sent in the request (Envoy's `RateLimitOverride`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Hits per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// Whether this descriptor is over its limit (false in shadow mode).
    pub over_limit: bool,
    /// The limit that decided, if any: of several (`rate_limits`), the one
    /// that refused, else the one with the least left.
    pub limit: Option<AppliedLimit>,
    /// Hits left.
    pub remaining: u32,
    /// Time until the limit resets (OK) or until a request would be admitted
    /// (over the limit).
    pub reset: Nanos,
    /// The descriptor's other limits, when it has several; empty otherwise.
    pub others: Vec<LimitStatus>,
    /// Whether the deciding limit is a soft one (`over_limit: tag`) that
    /// the request is over: admitted (`over_limit` is false), and tagged.
    pub tagged: bool,
}

impl DescriptorStatus {
    /// Every limit of the descriptor, the deciding one first, as
    /// `(limit, over_limit, remaining, reset, tagged)`.
    pub fn limits(&self) -> impl Iterator<Item = (&AppliedLimit, bool, u32, Nanos, bool)> {
        let decided = self.limit.as_ref().map(|limit| {
            (
                limit,
                self.over_limit,
                self.remaining,
                self.reset,
                self.tagged,
            )
        });
        let others = self
            .others
            .iter()
            .map(|o| (&o.limit, o.over_limit, o.remaining, o.reset, o.tagged));
        decided.into_iter().chain(others)
    }
}

/// One of a descriptor's several limits, as [`DescriptorStatus`] reports the deciding one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitStatus {
    /// Whether this limit refused (false in shadow mode).
    pub over_limit: bool,
    /// The limit.
    pub limit: AppliedLimit,
    /// Hits left.
    pub remaining: u32,
    /// As [`DescriptorStatus::reset`].
    pub reset: Nanos,
    /// As [`DescriptorStatus::tagged`].
    pub tagged: bool,
}

/// The limit reported for a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedLimit {
    /// `rate_limit.name` (empty when unnamed), as the reference reports it.
    pub name: Arc<str>,
    /// The policy name for response headers: the name, else the rule's path.
    pub policy: Arc<str>,
    /// Hits per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// The window in seconds (the unit times its multiplier; for a calendar
    /// limit, the current calendar window's length).
    pub window_seconds: u64,
    /// Shadow mode: reported, never enforced.
    pub shadow: bool,
    /// A soft limit (`over_limit: tag`): over it, the request is admitted
    /// and tagged, never refused.
    pub soft: bool,
    /// The request's own limit override, which no rule wrote.
    pub from_request: bool,
    /// The rule that set the limit: its index in the rule set in force
    /// ([`crate::rules::Rule::index`]); `None` for a request's override.
    pub rule: Option<usize>,
    /// Whose counter: the rule's domain and path as one number
    /// ([`crate::store::scope_tag`]), the same across reloads; what tells
    /// two rules of one name apart.
    pub scope: u64,
}

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is refused.
    pub over_limit: bool,
    /// One status per request descriptor, in order.
    pub statuses: Vec<DescriptorStatus>,
    /// Response headers to add (empty when headers are switched off).
    pub headers: Vec<(&'static str, String)>,
    /// Headers to add to the request on its way upstream: the soft limits
    /// an admitted request is over (`x-tollgate-over-limit`); empty
    /// otherwise.
    pub request_headers: Vec<(&'static str, String)>,
    /// The body of the refusal Envoy sends (`--over-limit-body json`):
    /// only on a refused request.
    pub body: Option<String>,
    /// The limit that decided the request (the one that refused it, else
    /// the one with the least left), for Envoy's dynamic metadata (an
    /// access log can name the rule); `None` when no rule limited it.
    pub deciding: Option<Deciding>,
}

/// The rule whose limit decided a request, and what it left.
#[derive(Debug, Clone)]
pub struct Deciding {
    /// The rule (its path, name and `file:line`).
    pub rule: std::sync::Arc<crate::rules::Rule>,
    /// What it left (0 when it refused).
    pub remaining: u32,
}

/// The same rule (its domain and path, which name it in any rule set: two
/// limiters over the same rules decide alike) and what it left.
impl PartialEq for Deciding {
    fn eq(&self, other: &Self) -> bool {
        self.rule.domain == other.rule.domain
            && self.rule.path == other.rule.path
            && self.remaining == other.remaining
    }
}

impl Eq for Deciding {}

/// When a request's store call started and ended, and its error if any.
#[derive(Debug, Clone)]
pub struct StoreCall {
    /// Asked.
    pub start: std::time::SystemTime,
    /// Answered (or failed).
    pub end: std::time::SystemTime,
    /// The store's error.
    pub error: Option<String>,
}

/// Why a request could not be decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The request itself is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The store failed and the operator asked for the reference's behaviour
    /// (an error, so that Envoy's `failure_mode_deny` decides).
    #[error("rate limit store unavailable: {0}")]
    Unavailable(StoreError),
}
