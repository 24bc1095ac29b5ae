//! The domain entry point: match a request's descriptors to rules, have the
//! store decide them together (all or nothing), and build the decision.
//! Nothing here knows a proto type.

mod failure;
mod headers;
mod observe;
mod resolve;

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use smallvec::SmallVec;

use crate::algorithm::Algorithm;
use crate::clock::{Clock, Nanos};
use crate::metrics::Metrics;
use crate::rules::{FailureMode, Limit, Rule, RuleSet, Unit};
use crate::store::{
    Check, CounterKey, MemoryStore, MemoryStoreOptions, Store, StoreError, refused,
};
use resolve::{drop_replaced, validate};

pub use headers::response_headers;

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
pub struct Status {
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
}

impl Status {
    /// Every limit of the descriptor, the deciding one first, as
    /// `(limit, over_limit, remaining, reset)`.
    pub fn limits(&self) -> impl Iterator<Item = (&AppliedLimit, bool, u32, Nanos)> {
        let decided = self
            .limit
            .as_ref()
            .map(|limit| (limit, self.over_limit, self.remaining, self.reset));
        let others = self
            .others
            .iter()
            .map(|o| (&o.limit, o.over_limit, o.remaining, o.reset));
        decided.into_iter().chain(others)
    }
}

/// One of a descriptor's several limits, as [`Status`] reports the deciding one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitStatus {
    /// Whether this limit refused (false in shadow mode).
    pub over_limit: bool,
    /// The limit.
    pub limit: AppliedLimit,
    /// Hits left.
    pub remaining: u32,
    /// As [`Status::reset`].
    pub reset: Nanos,
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
    /// The request's own limit override, which no rule wrote.
    pub from_request: bool,
}

/// The answer to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is refused.
    pub over_limit: bool,
    /// One status per request descriptor, in order.
    pub statuses: Vec<Status>,
    /// Response headers to add (empty when headers are switched off).
    pub headers: Vec<(&'static str, String)>,
}

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

/// Server-wide limiter settings.
#[derive(Debug, Clone, Copy)]
pub struct LimiterOptions {
    /// Failure mode for rules that do not set one.
    pub failure_mode: FailureMode,
    /// Add RateLimit / RateLimit-Policy / Retry-After headers.
    pub response_headers: bool,
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
        }
    }
}

impl Default for LimiterOptions {
    fn default() -> Self {
        Self {
            failure_mode: FailureMode::Allow,
            response_headers: true,
            default_algorithm: Algorithm::SlidingWindow,
            unavailable_on_store_error: false,
            instances: 1,
            shadow_mode: false,
            quota_mode: false,
            near_limit_ratio: 0.8,
            bounds: RequestBounds::default(),
            max_metric_series: 10_000,
            max_label_bytes: 128,
        }
    }
}

/// Decides requests against the current rules and the store.
pub struct Limiter {
    rules: ArcSwap<RuleSet>,
    store: Store,
    /// Where the `local` failure mode counts while the store is down.
    fallback: MemoryStore,
    clock: Arc<dyn Clock>,
    options: LimiterOptions,
    metrics: Arc<Metrics>,
    /// Key hash -> window of its last logged refusal (see `log_refusal`).
    refusals: parking_lot::Mutex<std::collections::HashMap<u64, u64>>,
}

/// Refusal-log entries kept before the oldest windows are forgotten.
const REFUSAL_LOG_KEYS: usize = 100_000;

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.store)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// One limit of a descriptor, resolved before the store is asked; its check
/// is the one at the same index in [`Plan::checks`].
pub(super) struct Planned {
    /// The request descriptor it belongs to.
    pub(super) descriptor: usize,
    pub(super) rule: Option<Arc<Rule>>,
    pub(super) limit: Limit,
    pub(super) shadow: bool,
}

impl Limiter {
    /// A limiter over `rules` and `store`, reading time from `clock`.
    pub fn new(
        rules: RuleSet,
        store: Store,
        clock: Arc<dyn Clock>,
        options: LimiterOptions,
    ) -> Self {
        Self {
            rules: ArcSwap::from_pointee(rules),
            store,
            fallback: MemoryStore::new(MemoryStoreOptions::default()),
            clock,
            options,
            metrics: Arc::new(Metrics::new(
                options.max_metric_series,
                options.max_label_bytes,
            )),
            refusals: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Drops state that can no longer matter, in the store and in the
    /// fallback of the `local` failure mode.
    pub fn sweep(&self, now: Nanos) -> usize {
        self.store.sweep(now) + self.fallback.sweep(now)
    }

    /// The metrics this limiter records.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The limiter's settings.
    pub fn options(&self) -> &LimiterOptions {
        &self.options
    }

    /// Swaps in a new rule set; requests in flight finish on the old one.
    /// Rules whose counters start afresh (a new algorithm, period or zone)
    /// are logged at warn, at most 20 of them by name.
    pub fn set_rules(&self, rules: RuleSet) {
        let restarted = crate::rules::restarted_counters(&self.rules.load(), &rules);
        for change in restarted.iter().take(20) {
            tracing::warn!(change = %change, "rule changed: counters restart");
        }
        if restarted.len() > 20 {
            tracing::warn!(
                more = restarted.len() - 20,
                "more rules changed algorithm, period or zone: their counters restart"
            );
        }
        self.rules.store(Arc::new(rules));
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load_full()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Decides a request.
    pub async fn should_rate_limit(&self, request: &Request<'_>) -> Result<Decision, LimitError> {
        if let Some(decided) = self.decide_now(request) {
            return decided;
        }
        let mut plan = Plan::default();
        let started = self.begin(request, &mut plan)?;
        let called = Instant::now();
        let result = match plan.checks.is_empty() {
            true => Ok(()),
            false => self.store.decide(&mut plan.checks, self.clock.now()).await,
        };
        self.complete(started, called, &mut plan, result)
    }

    /// As [`Limiter::should_rate_limit`], also saying when the store was
    /// asked and when it answered, if it was (for a tracing span). Two more
    /// clock reads than the untraced path: used only with tracing on.
    pub async fn should_rate_limit_timed(
        &self,
        request: &Request<'_>,
    ) -> (Result<Decision, LimitError>, Option<StoreCall>) {
        let mut plan = Plan::default();
        let started = match self.begin(request, &mut plan) {
            Ok(started) => started,
            Err(e) => return (Err(e), None),
        };
        let called = Instant::now();
        if plan.checks.is_empty() {
            return (self.complete(started, called, &mut plan, Ok(())), None);
        }
        let start = std::time::SystemTime::now();
        let result = self.store.decide(&mut plan.checks, self.clock.now()).await;
        let call = StoreCall {
            start,
            end: std::time::SystemTime::now(),
            error: result.as_ref().err().map(ToString::to_string),
        };
        (
            self.complete(started, called, &mut plan, result),
            Some(call),
        )
    }

    /// Decides a request at once when the store can answer without waiting
    /// (the memory store); `None` means the store must be waited for. The
    /// gRPC handler takes this path so the common case builds no large
    /// future.
    pub fn decide_now(&self, request: &Request<'_>) -> Option<Result<Decision, LimitError>> {
        if !self.store.answers_at_once() {
            return None;
        }
        let mut plan = Plan::default();
        let started = match self.begin(request, &mut plan) {
            Ok(started) => started,
            Err(e) => return Some(Err(e)),
        };
        let called = Instant::now();
        let result = match plan.checks.is_empty() {
            true => Ok(()),
            false => self.store.decide_now(&mut plan.checks, self.clock.now())?,
        };
        Some(self.complete(started, called, &mut plan, result))
    }

    /// Starts a decision: fills in the plan (in place: it is large, and
    /// moving it costs), or gives the (counted) reason the request is refused.
    fn begin(&self, request: &Request<'_>, plan: &mut Plan) -> Result<Instant, LimitError> {
        let started = Instant::now();
        self.plan(request, plan)
            .inspect_err(|e| self.count_error(e))?;
        Ok(started)
    }

    /// Builds the decision from the store's answer (asked at `called`, if
    /// there was anything to ask) and records the latencies.
    fn complete(
        &self,
        started: Instant,
        called: Instant,
        plan: &mut Plan,
        result: Result<(), StoreError>,
    ) -> Result<Decision, LimitError> {
        if !plan.checks.is_empty() {
            self.count_store_call(called, &result);
        }
        let decided = self.finish(plan, result.err());
        let seconds = started.elapsed().as_secs_f64();
        self.metrics.response_time.observe(seconds);
        self.metrics.response_samples.record(seconds);
        decided
    }

    /// Resolves every descriptor to its limits (or none) and builds the
    /// store checks, one per limit.
    fn plan(&self, request: &Request<'_>, plan: &mut Plan) -> Result<(), LimitError> {
        validate(request, &self.options.bounds)?;
        let rules = self.rules.load();
        let hits_default = u64::from(request.hits_addend.max(1));
        plan.descriptors = request.descriptors.len();
        let Plan {
            planned,
            checks,
            unlimited,
            ..
        } = plan;
        let known_domain = rules.has_domain(request.domain);
        for (d, descriptor) in request.descriptors.iter().enumerate() {
            // As the reference: an unknown domain has no limits, even for overrides.
            if !known_domain {
                continue;
            }
            if let Some(o) = descriptor.limit_override {
                // A limit sent by Envoy: per one unit, as the protocol means it.
                let limit =
                    Limit::per_unit(o.requests_per_unit, o.unit, self.options.default_algorithm);
                self.plan_limit(
                    (request, d),
                    (None, limit, false),
                    &[],
                    hits_default,
                    (planned, checks),
                );
                continue;
            }
            let Some(matched) = rules.lookup(request.domain, &descriptor.entries) else {
                continue;
            };
            for rule in matched.rules {
                let Some(limit) = rule.limit else {
                    // `unlimited: true`: never counted; the reference reports the
                    // most it can as remaining.
                    unlimited.push(d);
                    continue;
                };
                self.plan_limit(
                    (request, d),
                    (Some(rule.clone()), limit, rule.shadow_mode),
                    &matched.shared,
                    hits_default,
                    (planned, checks),
                );
            }
            let max = self.options.bounds.checks;
            if checks.len() > max {
                let e = LimitError::InvalidArgument(format!(
                    "the request needs more than {max} limit checks (its descriptors' limits together); the bound is --max-checks"
                ));
                return Err(e);
            }
        }
        drop_replaced(planned, checks);
        Ok(())
    }

    /// Adds one limit of descriptor `d` to the plan, with its store check.
    fn plan_limit(
        &self,
        (request, d): (&Request<'_>, usize),
        (rule, limit, shadow): (Option<Arc<Rule>>, Limit, bool),
        shared: &[(usize, &str)],
        hits_default: u64,
        (planned, checks): (&mut SmallVec<[Planned; 4]>, &mut SmallVec<[Check; 4]>),
    ) {
        let descriptor = &request.descriptors[d];
        let mut key = CounterKey::with_period(
            request.domain,
            limit.algorithm,
            limit.unit,
            limit.unit_multiplier,
            limit.calendar.map(|z| z.name()),
        );
        for (i, (k, v)) in descriptor.entries.iter().enumerate() {
            let value = shared.iter().find(|s| s.0 == i).map_or(*v, |s| s.1);
            key.entry(k, value);
        }
        let hits = descriptor.hits_addend.unwrap_or(hits_default);
        // Global shadow mode makes every limit a shadow: reported, counted, never enforced.
        let enforced = !shadow && !self.options.shadow_mode;
        let mut check = Check::new(key, limit.algorithm, limit.quota(), hits, enforced);
        check.quota_mode = self.options.quota_mode || rule.as_ref().is_some_and(|r| r.quota_mode);
        check.lease = limit.lease;
        checks.push(check);
        planned.push(Planned {
            descriptor: d,
            rule,
            limit,
            shadow,
        });
    }

    /// Turns the store's outcomes (or its failure) into the decision.
    /// (The plan is borrowed: it is large, and moving it costs.)
    fn finish(&self, plan: &mut Plan, failed: Option<StoreError>) -> Result<Decision, LimitError> {
        let Plan {
            descriptors,
            planned,
            checks,
            unlimited,
        } = plan;
        let descriptors = *descriptors;
        if let Some(err) = failed {
            if self.options.unavailable_on_store_error {
                let err = LimitError::Unavailable(err);
                self.count_error(&err);
                return Err(err);
            }
            tracing::debug!(%err, "store failed; answering from failure modes");
            self.apply_failure_modes(planned, checks);
        }
        let mut statuses = Vec::with_capacity(descriptors);
        // `planned` and `unlimited` are in request order: walk them alongside.
        let mut limits = planned.iter().zip(checks.iter()).peekable();
        let mut unlimited = unlimited.iter().peekable();
        for d in 0..descriptors {
            let mut decided: Option<((bool, bool, u64), LimitStatus)> = None;
            let mut others = Vec::new();
            while let Some((plan, check)) = limits.next_if(|(p, _)| p.descriptor == d) {
                let (allowed, remaining, reset) = match check.outcome {
                    Some(o) => (o.allowed, o.remaining, o.wait),
                    None => (true, plan.limit.requests_per_unit, 0),
                };
                self.count_decision(plan, check, allowed, remaining);
                if !allowed {
                    self.log_refusal(plan, check, check.enforced);
                }
                let status = LimitStatus {
                    over_limit: !allowed && check.enforced,
                    limit: applied(plan, &*self.clock),
                    remaining,
                    reset,
                };
                // The deciding limit: of those that refused (enforced before
                // shadow), the one with the longest wait, which is what
                // Retry-After says; else the one with the least left.
                let rank = (
                    !status.over_limit,
                    allowed,
                    if allowed {
                        u64::from(remaining)
                    } else {
                        u64::MAX - status.reset
                    },
                );
                match &decided {
                    Some((best, _)) if *best <= rank => others.push(status),
                    _ => others.extend(decided.replace((rank, status)).map(|(_, s)| s)),
                }
            }
            let decided = decided.map(|(_, s)| s);
            let is_unlimited = unlimited.next_if_eq(&&d).is_some();
            statuses.push(match decided {
                Some(s) => Status {
                    over_limit: s.over_limit,
                    limit: Some(s.limit),
                    remaining: s.remaining,
                    reset: s.reset,
                    others,
                },
                None => Status {
                    over_limit: false,
                    limit: None,
                    remaining: if is_unlimited { u32::MAX } else { 0 },
                    reset: 0,
                    others,
                },
            });
        }
        // The store's rule, quota mode included: what it refused, nothing spent.
        let over_limit = refused(checks.iter());
        let headers = if self.options.response_headers {
            response_headers(&statuses, over_limit)
        } else {
            Vec::new()
        };
        Ok(Decision {
            over_limit,
            statuses,
            headers,
        })
    }
}

/// A request resolved to limits, ready for the store.
#[derive(Default)]
struct Plan {
    /// Descriptors in the request.
    descriptors: usize,
    /// One per limit, in request order; `checks` is parallel to it.
    planned: SmallVec<[Planned; 4]>,
    checks: SmallVec<[Check; 4]>,
    /// Descriptors matched to `unlimited: true` rules, in request order.
    unlimited: SmallVec<[usize; 2]>,
}

fn applied(plan: &Planned, clock: &dyn Clock) -> AppliedLimit {
    let (name, policy) = match &plan.rule {
        Some(rule) => (rule.reported_name.clone(), rule.policy_name.clone()),
        None => (Arc::from(""), Arc::from("override")),
    };
    AppliedLimit {
        name,
        policy,
        requests_per_unit: plan.limit.requests_per_unit,
        unit: plan.limit.unit,
        from_request: plan.rule.is_none(),
        window_seconds: match plan.limit.calendar {
            None => plan.limit.period_seconds(),
            Some(_) => {
                // Only calendar windows need the time (a clock read costs).
                let w = plan.limit.quota().window_at(clock.now());
                (w.end - w.start)
                    .div_ceil(crate::clock::NANOS_PER_SEC / crate::algorithm::NANOS_PER_TICK)
            }
        },
        shadow: plan.shadow,
    }
}

#[cfg(test)]
mod tests;
