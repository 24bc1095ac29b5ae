//! The limiter's settings and the bounds on one request.

use crate::algorithm::Algorithm;
use crate::rules::FailureMode;

/// Server-wide limiter settings.
#[derive(Debug, Clone, Copy)]
pub struct LimiterOptions {
    /// Failure mode for rules that do not set one.
    pub failure_mode: FailureMode,
    /// Add RateLimit / RateLimit-Policy / Retry-After headers.
    pub response_headers: bool,
    /// The body of every OVER_LIMIT answer (`--over-limit-body`).
    pub over_limit_body: super::answer::OverLimitBody,
    /// Algorithm for limits sent in requests (`RateLimitOverride`).
    pub default_algorithm: Algorithm,
    /// On a store failure, answer gRPC UNAVAILABLE instead of applying the
    /// failure modes (the reference's behaviour).
    pub unavailable_on_store_error: bool,
    /// Tollgate instances sharing the store: the `local` failure mode allows
    /// `requests_per_unit / instances` per instance.
    pub instances: u32,
    /// Global shadow mode: over-limit decisions are answered OK (and counted).
    pub shadow_mode: bool,
    /// Global quota mode: every descriptor is in quota mode.
    pub quota_mode: bool,
    /// Admitted hits above this share of the limit count as near the limit.
    pub near_limit_ratio: f64,
    /// The largest request a client may send (see [`RequestBounds`]).
    pub bounds: RequestBounds,
    /// Metric label sets made from request keys or values (`--max-metric-series`).
    pub max_metric_series: u64,
    /// Longest label value made from a request (`--max-label-bytes`).
    pub max_label_bytes: usize,
    /// At which level refusals are logged (`--log-refusals`).
    pub refusal_log: RefusalLog,
    /// The most refusal lines a second (`--refusal-log-rate`); one key is
    /// logged at most once a second whatever this says.
    pub refusal_log_rate: u32,
    /// Whether a decision reads the wall clock for the latency metrics
    /// (`tollgate_response_time_seconds`, the store call's): off where wall
    /// time means nothing (a simulation, whose clock is simulated).
    pub timed: bool,
}

/// At which level refusals are logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalLog {
    /// Not at all.
    Off,
    /// At info (hidden at `--log-level warn`).
    Info,
    /// At warn.
    Warn,
}

/// How large a request may be. Deciding costs time linear in a request's
/// size while the store holds the request's counters, so these bound how
/// long one client's request can hold up another's. A request past a bound
/// is refused as malformed, naming the bound and its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestBounds {
    /// Descriptors per request (`--max-descriptors`).
    pub descriptors: usize,
    /// Entries per descriptor (`--max-entries`).
    pub entries: usize,
    /// Bytes of one entry's key or value, and of the domain (`--max-value-bytes`).
    pub value_bytes: usize,
    /// Bytes of the encoded request, refused before it is decoded (`--max-request-bytes`).
    pub request_bytes: usize,
    /// Limit checks one request may need, all its descriptors' limits
    /// together (`--max-checks`): one request is decided by one script call
    /// on Redis, which holds Redis for everyone while it runs.
    pub checks: usize,
    /// Bytes of a request ID (`request_id`, `release`, `settle`), which an
    /// in-flight cap or a reservation holds (`--max-request-id-bytes`).
    pub request_id_bytes: usize,
    /// The most request IDs one key holds (`--max-held-ids`): past it, a
    /// reservation is refused.
    pub held_ids: u32,
}

impl Default for RequestBounds {
    fn default() -> Self {
        // Envoy sends one descriptor per matching `rate_limits` action list,
        // rarely more than a handful with a few entries each; values come
        // from headers, whose whole list Envoy caps at 60 KiB by default, so
        // any value Envoy forwards fits.
        Self {
            descriptors: 128,
            entries: 32,
            value_bytes: 64 * 1024,
            request_bytes: 128 * 1024,
            checks: 1024,
            request_id_bytes: 256,
            held_ids: crate::rules::DEFAULT_MAX_HELD_IDS,
        }
    }
}

impl Default for LimiterOptions {
    fn default() -> Self {
        Self {
            failure_mode: FailureMode::Allow,
            response_headers: true,
            over_limit_body: super::answer::OverLimitBody::None,
            default_algorithm: Algorithm::SlidingWindow,
            unavailable_on_store_error: false,
            instances: 1,
            shadow_mode: false,
            quota_mode: false,
            near_limit_ratio: 0.8,
            bounds: RequestBounds::default(),
            max_metric_series: 10_000,
            max_label_bytes: 128,
            refusal_log: RefusalLog::Info,
            refusal_log_rate: 100,
            timed: true,
        }
    }
}
