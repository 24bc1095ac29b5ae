//! The domain entry point: match a request's descriptors to rules, have the
//! store decide them together (all or nothing), and build the decision.
//! Nothing here knows a proto type.

mod answer;
mod compiled;
mod failure;
mod finish;
mod headers;
mod inspect;
mod observe;
mod options;
mod plan;
mod types;
mod validate;

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::clock::{Clock, Nanos};
use crate::metrics::Metrics;
use crate::rules::{Limit, Rule, RuleSet};
use crate::store::{MemoryStore, MemoryStoreOptions, Store, StoreError};

pub use answer::{OVER_LIMIT_HEADER, OverLimitBody};
pub use headers::response_headers;
pub use inspect::{BulkResetError, Reset};
pub(crate) use observe::Observer;
pub use options::{LimiterOptions, RefusalLog, RequestBounds};
use plan::Plan;
pub use types::{
    AppliedLimit, Deciding, Decision, Descriptor, DescriptorStatus, LimitError, LimitOverride,
    LimitStatus, Request, StoreCall,
};

/// Decides requests against the current rules and the store.
pub struct Limiter {
    rules: ArcSwap<compiled::Compiled>,
    store: Store,
    /// Where the `local` failure mode counts while the store is down.
    fallback: MemoryStore,
    clock: Arc<dyn Clock>,
    options: LimiterOptions,
    metrics: Arc<Metrics>,
    /// Which refusals were logged lately, per thread (see `log_refusal`).
    refusals: crate::shards::PerThread<observe::RefusalsLogged>,
    /// Shown every decided request (the candidate rules, the view of who
    /// is limited), whichever adapter asked (gRPC or `/json`).
    observers: std::sync::OnceLock<Box<[Arc<dyn Observer>]>>,
    /// Rule path -> when its counter restart was last logged: a rule that
    /// flaps between two definitions is logged once per
    /// [`RESTART_LOG_EVERY`], not on every reload.
    restarts_logged: parking_lot::Mutex<std::collections::HashMap<String, Nanos>>,
}

/// Logs what loaded but probably is not what was meant (at most 20 lines,
/// then a count), as `tollgate check` prints it.
fn log_rule_warnings(rules: &RuleSet) {
    let warnings = rules.warnings();
    for warning in warnings.iter().take(20) {
        tracing::warn!(warning = %crate::rules::printable(warning), "rules loaded with a warning");
    }
    if warnings.len() > 20 {
        tracing::warn!(
            more = warnings.len() - 20,
            "more rule warnings (tollgate check lists them all)"
        );
    }
}

/// A rule's counter restarts are logged at most this often.
const RESTART_LOG_EVERY: Nanos = 60 * crate::clock::NANOS_PER_SEC;
/// Rules whose last restart log is remembered (beyond, the memory is reset).
const RESTART_LOG_RULES: usize = 10_000;

/// Refusal-log entries kept (all threads together) before the oldest
/// windows are forgotten.
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
    /// A soft limit (`over_limit: tag`): never enforced; over it, the
    /// request is tagged (unless global shadow mode changes nothing).
    pub(super) soft: bool,
    /// The rule's counters, from the snapshot it was planned from (`None`
    /// for a limit sent in the request, or a rule labelled with request
    /// values).
    pub(super) stats: Option<Arc<crate::metrics::LimitStats>>,
}

impl Limiter {
    /// A limiter over `rules` and `store`, reading time from `clock`, with
    /// metrics of its own.
    pub fn new(
        rules: RuleSet,
        store: Store,
        clock: Arc<dyn Clock>,
        options: LimiterOptions,
    ) -> Self {
        let metrics = Arc::new(Metrics::new(
            options.max_metric_series,
            options.max_label_bytes,
        ));
        Self::with_metrics(rules, store, clock, options, metrics)
    }

    /// [`Limiter::new`], recording into `metrics` (the process's, made at
    /// start-up and shared with the listeners).
    pub(crate) fn with_metrics(
        rules: RuleSet,
        store: Store,
        clock: Arc<dyn Clock>,
        options: LimiterOptions,
        metrics: Arc<Metrics>,
    ) -> Self {
        log_rule_warnings(&rules);
        Self {
            rules: ArcSwap::from_pointee(compiled::Compiled::new(rules)),
            store,
            fallback: MemoryStore::new(MemoryStoreOptions::default()),
            clock,
            options,
            metrics,
            refusals: crate::shards::PerThread::new(),
            observers: std::sync::OnceLock::new(),
            restarts_logged: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// A limiter over `rules` on a fresh memory store with the default
    /// bounds and options, reading time from `clock`.
    pub fn in_memory(rules: RuleSet, clock: Arc<dyn Clock>) -> Self {
        Self::new(
            rules,
            Store::memory(MemoryStoreOptions::default()),
            clock,
            LimiterOptions::default(),
        )
    }

    /// Shows every request this limiter decides from now on to each of
    /// `observers`, after its decision (which they never change). Set
    /// once; a second call is ignored and says so.
    pub(crate) fn set_observers(&self, observers: Vec<Arc<dyn Observer>>) -> bool {
        observers.is_empty() || self.observers.set(observers.into()).is_ok()
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
    /// are logged at warn, at most 20 of them by name, and each rule at most
    /// once a minute (a rule flapping between two definitions would log on
    /// every reload).
    pub fn set_rules(&self, rules: RuleSet) {
        let restarted = crate::rules::restarted_counters(self.rules.load().rules(), &rules);
        let now = self.clock.now();
        let mut logged = self.restarts_logged.lock();
        if logged.len() >= RESTART_LOG_RULES {
            logged.clear();
        }
        let mut to_log = Vec::new();
        let mut quiet = 0usize;
        for change in &restarted {
            match logged.get(&change.rule) {
                Some(at) if now.saturating_sub(*at) < RESTART_LOG_EVERY => quiet += 1,
                _ => {
                    logged.insert(change.rule.clone(), now);
                    to_log.push(change);
                }
            }
        }
        drop(logged);
        for change in to_log.iter().take(20) {
            tracing::warn!(change = %change, "rule changed: counters restart");
        }
        // Rules logged less than a minute ago are only counted, in this line
        // when there is one: a flapping rule alone logs nothing more.
        if to_log.len() > 20 || (quiet > 0 && !to_log.is_empty()) {
            tracing::warn!(
                more = to_log.len().saturating_sub(20) + quiet,
                "more rules changed algorithm, period or zone: their counters restart"
            );
        }
        log_rule_warnings(&rules);
        self.rules.store(Arc::new(compiled::Compiled::new(rules)));
        self.count_load(true);
    }

    /// Counts a rule load in the metrics, whatever the rules came from
    /// (files, SIGHUP, xDS): `ok`, the rules in force now (every
    /// [`Limiter::set_rules`] counts itself; the first load at start-up is
    /// counted by whoever loaded it), or not (the rules in force stay).
    pub(crate) fn count_load(&self, ok: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        if !ok {
            self.metrics.config_load_error.fetch_add(1, Relaxed);
            return;
        }
        self.metrics.config_load_success.fetch_add(1, Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.metrics.config_last_success.store(now, Relaxed);
    }

    /// Whether a request that cannot be decided (it does not decode, or it
    /// breaks a bound) is to be refused: its domain (`None` when not even
    /// that could be read: any domain) has a limit that fails closed
    /// (`failure_mode: deny`, given or by `--failure-mode`). Answering such
    /// a request with an error would let it through: Envoy fails open on
    /// errors unless told otherwise.
    pub fn denies_undecided(&self, domain: Option<&str>) -> bool {
        self.rules
            .load()
            .denies_undecided(domain, self.options.failure_mode)
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<RuleSet> {
        self.rules.load().rules().clone()
    }

    /// The rules in force whenever it is called (a reload reaches the
    /// caller): for the parts that hold handles rather than the limiter.
    pub fn rules_in_force(self: &Arc<Self>) -> Arc<dyn Fn() -> Arc<RuleSet> + Send + Sync> {
        let limiter = self.clone();
        Arc::new(move || limiter.rules())
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
        let called = self.now();
        let result = match plan.checks.is_empty() {
            true => Ok(()),
            false => self.store.decide(&mut plan.checks, self.clock.now()).await,
        };
        self.complete(request, started, called, &mut plan, result)
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
        let called = self.now();
        if plan.checks.is_empty() {
            return (
                self.complete(request, started, called, &mut plan, Ok(())),
                None,
            );
        }
        let start = std::time::SystemTime::now();
        let result = self.store.decide(&mut plan.checks, self.clock.now()).await;
        let call = StoreCall {
            start,
            end: std::time::SystemTime::now(),
            error: result.as_ref().err().map(ToString::to_string),
        };
        (
            self.complete(request, started, called, &mut plan, result),
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
        let called = self.now();
        let result = match plan.checks.is_empty() {
            true => Ok(()),
            false => self.store.decide_now(&mut plan.checks, self.clock.now())?,
        };
        Some(self.complete(request, started, called, &mut plan, result))
    }

    /// The wall clock, for the latency metrics; `None` when they are off
    /// ([`LimiterOptions::timed`]).
    fn now(&self) -> Option<Instant> {
        self.options.timed.then(Instant::now)
    }

    /// Starts a decision: fills in the plan (in place: it is large, and
    /// moving it costs), or gives the (counted) reason the request is refused.
    fn begin(&self, request: &Request<'_>, plan: &mut Plan) -> Result<Option<Instant>, LimitError> {
        let started = self.now();
        self.plan(request, plan)
            .inspect_err(|e| self.count_error(e))?;
        Ok(started)
    }

    /// Builds the decision from the store's answer (asked at `called`, if
    /// there was anything to ask), records the latencies, and shows the
    /// decision to the observers.
    fn complete(
        &self,
        request: &Request<'_>,
        started: Option<Instant>,
        called: Option<Instant>,
        plan: &mut Plan,
        result: Result<(), StoreError>,
    ) -> Result<Decision, LimitError> {
        if !plan.checks.is_empty() {
            self.count_store_call(called, &result);
        }
        let decided = self.finish(request, plan, result.err());
        if let Some(started) = started {
            let seconds = started.elapsed().as_secs_f64();
            self.metrics.response_time.observe(seconds);
            self.metrics.response_samples.record(seconds);
        }
        if let (Some(observers), Ok(decision)) = (self.observers.get(), &decided) {
            for observer in observers {
                observer.observe(request, decision);
            }
        }
        decided
    }
}

#[cfg(test)]
mod answer_tests;
#[cfg(test)]
mod held_tests;
#[cfg(test)]
mod tests;
