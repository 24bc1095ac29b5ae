//! Every metric in one place, written in the Prometheus text format: the
//! limiter's and the store's here, the quota service's in [`rlqs`], the
//! candidate rules' in [`candidate`], all through [`exposition`].
//!
//! Names and labels follow envoyproxy/ratelimit's Prometheus mapping
//! (`ratelimit_service_rate_limit_*{domain, key1, key2, ...}`), so existing
//! dashboards keep working. Label values come from the rules (the
//! descriptor's path, e.g. `key1="path_/login"`, `key2="remote_address"`).
//! Request values appear only where a rule opts in with `detailed_metric` or
//! `value_to_metric`, and request keys only for limits sent in the request;
//! those label sets are bounded: at most `max_series` of them (past it, hits
//! go to one `overflow="true"` series and are counted in
//! `tollgate_metric_series_overflow_total`), each value cut to
//! `max_label_bytes`. Label sets from the rules are not capped: the rule
//! files bound them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// gRPC streams and connections refused at the HTTP/2 level
/// (`tollgate_grpc_protocol_errors_total`): counted by the logging layer that
/// sees the HTTP/2 library's refusals.
static GRPC_PROTOCOL_ERRORS: AtomicU64 = AtomicU64::new(0);

/// Counts one gRPC stream or connection refused at the HTTP/2 level.
pub(crate) fn count_protocol_error() {
    GRPC_PROTOCOL_ERRORS.fetch_add(1, Ordering::Relaxed);
}

use parking_lot::RwLock;

pub(crate) mod candidate;
mod data;
pub(crate) mod exposition;
mod histogram;
mod labels;
pub(crate) mod limited;
pub(crate) mod rlqs;
mod unmatched;

pub(crate) use histogram::{Histogram, Samples};
pub(crate) use labels::{label_value, labels, metric_labels, push_label, rule_labels, truncated};

use candidate::CandidateMetrics;
use exposition::{Exposition, Kind};
use rlqs::RlqsMetrics;

/// Counters of one limit (one label set).
#[derive(Debug, Default)]
pub struct LimitStats {
    /// Hits asked for (hits_addend summed).
    pub total_hits: AtomicU64,
    /// Hits refused (or, in shadow mode, that would have been).
    pub over_limit: AtomicU64,
    /// Hits admitted above the near-limit ratio.
    pub near_limit: AtomicU64,
    /// Hits admitted.
    pub within_limit: AtomicU64,
    /// Hits over the limit but admitted because of shadow mode or a soft
    /// limit (`over_limit: tag`).
    pub shadow_mode: AtomicU64,
}

/// Selects one counter of a [`LimitStats`].
type Field = fn(&LimitStats) -> &AtomicU64;

/// Descriptors answered from each failure mode.
#[derive(Debug, Default)]
pub struct FailureModeCounters {
    /// `failure_mode: allow`.
    pub allow: AtomicU64,
    /// `failure_mode: deny`.
    pub deny: AtomicU64,
    /// `failure_mode: local` (the in-process fallback).
    pub local: AtomicU64,
}

/// Open connections, kept by the listeners (gauges).
#[derive(Debug, Default)]
pub(crate) struct Connections {
    /// Open gRPC connections, all workers together.
    pub grpc: Arc<AtomicU64>,
    /// Open admin HTTP connections, all admin listeners together.
    pub admin: Arc<AtomicU64>,
    /// Admin connections with a request in progress (the others are idle,
    /// and the first to go when the bound is reached).
    pub admin_busy: Arc<AtomicU64>,
}

/// What `/metrics` shows beside the limiter's own: each subsystem's
/// numbers, read at one moment.
pub(crate) struct Others {
    /// The quota service.
    pub rlqs: RlqsMetrics,
    /// The candidate rules, when configured.
    pub candidate: Option<CandidateMetrics>,
    /// Who is being limited, when the view is on.
    pub limited: Option<limited::LimitedMetrics>,
    /// Admin requests refused.
    pub admin_refused: u64,
    /// Admin requests with a wrong or missing bearer token.
    pub admin_auth_failures: u64,
    /// Admin requests answered 429 after too many of those.
    pub admin_auth_throttled: u64,
    /// The Redis store's background work (`None` off Redis).
    pub redis: Option<crate::store::redis::RedisEvents>,
    /// The data directory's writes (`None` without `--data-dir`).
    pub data: Option<crate::store::memory::DataEvents>,
}

/// Every metric of the process.
#[derive(Debug)]
pub struct Metrics {
    limits: RwLock<BTreeMap<String, Arc<LimitStats>>>,
    /// Label sets made from request keys or values so far.
    request_series: AtomicU64,
    /// The most label sets made from request keys or values.
    max_series: u64,
    /// The longest label value made from a request, in bytes.
    max_label_bytes: usize,
    /// Where hits go once `max_series` is reached.
    overflow: Arc<LimitStats>,
    /// Times a label set was not made because of `max_series`.
    pub series_overflow: AtomicU64,
    /// ShouldRateLimit latency.
    pub response_time: Histogram,
    /// ShouldRateLimit latency samples, for statsd.
    pub response_samples: Samples,
    /// Requests refused as malformed.
    pub invalid_argument: AtomicU64,
    /// Requests answered UNAVAILABLE (the reference's store-error mode).
    pub unavailable: AtomicU64,
    /// Requests that could not be decided (malformed, or above a bound)
    /// answered OVER_LIMIT, their domain failing closed.
    pub undecided_refused: AtomicU64,
    /// Descriptors no rule matched, by domain and first key.
    pub(crate) unmatched: unmatched::Unmatched,
    /// Store call latency.
    pub store_call: Histogram,
    /// Store errors: timeouts.
    pub store_timeout: AtomicU64,
    /// Store errors: circuit open (not attempted).
    pub store_circuit_open: AtomicU64,
    /// Store errors: other.
    pub store_error: AtomicU64,
    /// Descriptors answered from a failure mode.
    pub failure_mode: FailureModeCounters,
    /// 1 while the store's circuit is open.
    pub circuit_open: AtomicU64,
    /// Rule loads that succeeded.
    pub config_load_success: AtomicU64,
    /// Rule loads that failed (the old rules stayed in force).
    pub config_load_error: AtomicU64,
    /// Unix time of the last good load.
    pub config_last_success: AtomicU64,
    /// Open connections (set by the listeners).
    pub(crate) connections: Arc<Connections>,
}

impl Metrics {
    /// Metrics with at most `max_series` label sets made from requests, each
    /// label value at most `max_label_bytes` long.
    pub fn new(max_series: u64, max_label_bytes: usize) -> Self {
        Self {
            limits: RwLock::default(),
            request_series: AtomicU64::new(0),
            max_series,
            max_label_bytes,
            overflow: Arc::default(),
            series_overflow: AtomicU64::new(0),
            response_time: Histogram::default(),
            response_samples: Samples::default(),
            invalid_argument: AtomicU64::new(0),
            undecided_refused: AtomicU64::new(0),
            unmatched: unmatched::Unmatched::default(),
            unavailable: AtomicU64::new(0),
            store_call: Histogram::default(),
            store_timeout: AtomicU64::new(0),
            store_circuit_open: AtomicU64::new(0),
            store_error: AtomicU64::new(0),
            failure_mode: Default::default(),
            circuit_open: AtomicU64::new(0),
            config_load_success: AtomicU64::new(0),
            config_load_error: AtomicU64::new(0),
            config_last_success: AtomicU64::new(0),
            connections: Arc::default(),
        }
    }

    /// The longest label value made from a request, in bytes.
    pub fn max_label_bytes(&self) -> usize {
        self.max_label_bytes
    }

    /// The counters for one label set from the rules (`domain`, then
    /// `key1`, `key2`, ...).
    pub fn limit(&self, labels: &str) -> Arc<LimitStats> {
        if let Some(stats) = self.limits.read().get(labels) {
            return stats.clone();
        }
        self.limits
            .write()
            .entry(labels.to_owned())
            .or_default()
            .clone()
    }

    /// The counters for a label set made from a request's keys or values:
    /// the shared overflow series once `max_series` such sets exist.
    pub fn request_limit(&self, labels: &str) -> Arc<LimitStats> {
        if let Some(stats) = self.limits.read().get(labels) {
            return stats.clone();
        }
        let mut limits = self.limits.write();
        if let Some(stats) = limits.get(labels) {
            return stats.clone();
        }
        if self.request_series.load(Ordering::Relaxed) >= self.max_series {
            self.series_overflow.fetch_add(1, Ordering::Relaxed);
            return self.overflow.clone();
        }
        self.request_series.fetch_add(1, Ordering::Relaxed);
        limits.entry(labels.to_owned()).or_default().clone()
    }

    /// Calls `f` with every label set (`domain="d",key1="k"...`) and its
    /// counters, the overflow series (`overflow="true"`) included once used.
    pub fn for_each_limit(&self, mut f: impl FnMut(&str, &LimitStats)) {
        for (labels, stats) in self.limits.read().iter() {
            f(labels, stats);
        }
        if self.series_overflow.load(Ordering::Relaxed) > 0 {
            f("overflow=\"true\"", &self.overflow);
        }
    }

    /// The Prometheus text exposition.
    /// The limiter's and the store's families (the tests read these alone).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        self.write_own(&mut out);
        out
    }

    /// Everything `/metrics` shows: these families, then each subsystem's.
    pub(crate) fn render_all(&self, others: &Others) -> String {
        let mut out = String::with_capacity(8192);
        self.write_own(&mut out);
        let mut e = Exposition::new(&mut out);
        self.unmatched.render(&mut e);
        rlqs::render(&mut e, &others.rlqs);
        if let Some(c) = &others.candidate {
            candidate::render(&mut e, c);
        }
        if let Some(l) = &others.limited {
            limited::render(&mut e, l);
        }
        if let Some(redis) = &others.redis {
            write_redis_events(&mut e, redis);
        }
        if let Some(d) = &others.data {
            data::render(&mut e, d);
        }
        e.counter(
            "tollgate_admin_refused_total",
            "Admin requests refused: a Host that is not served, a cross-site request, or a /json body not declared as JSON.",
            others.admin_refused,
        );
        e.counter(
            "tollgate_admin_auth_failures_total",
            "Admin requests with a wrong or missing bearer token (a reset, or a read with --admin-reads token).",
            others.admin_auth_failures,
        );
        e.counter(
            "tollgate_admin_auth_throttled_total",
            "Admin requests answered 429 without their token being checked: their address failed too often (--admin-auth-max-failures).",
            others.admin_auth_throttled,
        );
        out
    }

    fn write_own(&self, out: &mut String) {
        let limits = self.limits.read();
        let per_limit: [(&str, &str, Field); 5] = [
            ("total_hits", "Hits asked for, per limit.", |s| {
                &s.total_hits
            }),
            ("over_limit", "Hits over the limit, per limit.", |s| {
                &s.over_limit
            }),
            (
                "near_limit",
                "Admitted hits above the near-limit ratio, per limit.",
                |s| &s.near_limit,
            ),
            ("within_limit", "Admitted hits, per limit.", |s| {
                &s.within_limit
            }),
            (
                "shadow_mode",
                "Hits over the limit admitted by shadow mode or a soft limit (over_limit: tag), per limit.",
                |s| &s.shadow_mode,
            ),
        ];
        let overflowed = self.series_overflow.load(Ordering::Relaxed) > 0;
        for (name, help, field) in per_limit {
            let metric = format!("ratelimit_service_rate_limit_{name}");
            let mut e = Exposition::new(out);
            e.family(&metric, help, Kind::Counter);
            for (labels, stats) in limits.iter() {
                e.sample(&metric, labels, field(stats).load(Ordering::Relaxed));
            }
            if overflowed {
                e.sample(
                    &metric,
                    "overflow=\"true\"",
                    field(&self.overflow).load(Ordering::Relaxed),
                );
            }
        }
        drop(limits);
        self.response_time.write(
            out,
            "ratelimit_server_should_rate_limit_response_time_seconds",
            "ShouldRateLimit latency.",
        );
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut e = Exposition::new(out);
        e.counter(
            "tollgate_metric_series_overflow_total",
            "Hits counted in the overflow series because --max-metric-series label sets made from requests exist.",
            load(&self.series_overflow),
        )
        .counter(
            "ratelimit_service_call_should_rate_limit_service_error",
            "Requests refused as malformed (INVALID_ARGUMENT).",
            load(&self.invalid_argument),
        )
        .counter(
            "tollgate_undecided_refused_total",
            "Requests that could not be decided (malformed, or above a bound) answered OVER_LIMIT because their domain has a limit with failure mode deny.",
            load(&self.undecided_refused),
        )
        .counter(
            "ratelimit_service_call_should_rate_limit_redis_error",
            "Requests answered UNAVAILABLE because the store failed.",
            load(&self.unavailable),
        )
        .counter(
            "tollgate_store_timeouts_total",
            "Store calls that timed out.",
            load(&self.store_timeout),
        )
        .counter(
            "tollgate_store_circuit_open_total",
            "Store calls not attempted because the circuit was open.",
            load(&self.store_circuit_open),
        )
        .counter(
            "tollgate_store_errors_total",
            "Other store errors.",
            load(&self.store_error),
        )
        .counter(
            "tollgate_failure_mode_allow_total",
            "Descriptors admitted by failure_mode allow.",
            load(&self.failure_mode.allow),
        )
        .counter(
            "tollgate_failure_mode_deny_total",
            "Descriptors refused by failure_mode deny.",
            load(&self.failure_mode.deny),
        )
        .counter(
            "tollgate_failure_mode_local_total",
            "Descriptors decided by the local fallback.",
            load(&self.failure_mode.local),
        )
        .gauge(
            "tollgate_store_circuit_open",
            "1 while the store's circuit is open.",
            load(&self.circuit_open),
        )
        .counter(
            "ratelimit_service_config_load_success",
            "Rule loads that succeeded.",
            load(&self.config_load_success),
        )
        .counter(
            "ratelimit_service_config_load_error",
            "Rule loads that failed; the rules in force were kept.",
            load(&self.config_load_error),
        )
        .family(
            "tollgate_build_info",
            "The running build: its version and git commit.",
            Kind::Gauge,
        )
        .sample(
            "tollgate_build_info",
            &format!(
                "version=\"{}\",commit=\"{}\"",
                crate::build_info::VERSION,
                crate::build_info::COMMIT
            ),
            1,
        )
        .counter(
            "tollgate_grpc_protocol_errors_total",
            "gRPC streams and connections refused at the HTTP/2 protocol level (Envoy applies its failure_mode_deny to them).",
            GRPC_PROTOCOL_ERRORS.load(Ordering::Relaxed),
        );
        self.store_call
            .write(out, "tollgate_store_call_seconds", "Store call latency.");
        Exposition::new(out)
            .gauge(
                "tollgate_config_last_success_timestamp_seconds",
                "Unix time of the last good rule load.",
                load(&self.config_last_success),
            )
            .gauge(
                "tollgate_grpc_connections",
                "Open gRPC connections (bounded by --max-connections).",
                load(&self.connections.grpc),
            )
            .gauge(
                "tollgate_admin_connections",
                "Open admin HTTP connections (bounded by --max-admin-connections).",
                load(&self.connections.admin),
            )
            .gauge(
                "tollgate_admin_connections_busy",
                "Admin connections with a request in progress; the idle others are closed first when the bound is reached.",
                load(&self.connections.admin_busy),
            );
    }
}

/// The Redis store's background work: the breaker's confirming PINGs, the
/// cancellations of calls left without an answer and the releases owed to
/// Redis while it was down.
fn write_redis_events(e: &mut Exposition<'_>, redis: &crate::store::redis::RedisEvents) {
    let checks = "tollgate_store_circuit_checks_total";
    e.family(
        checks,
        "Confirming PINGs after --redis-breaker failures in a row: answered keeps the circuit closed (calls failed while Redis was up: the timeout may be too tight for the load), failed opens it.",
        Kind::Counter,
    )
    .sample(checks, "result=\"answered\"", redis.checks_answered)
    .sample(checks, "result=\"failed\"", redis.checks_failed);
    let cancels = "tollgate_store_cancellations_total";
    e.family(
        cancels,
        "Cancellations of Redis calls left without an answer: delivered (the call spent nothing) or abandoned (what it committed, if it ran, stays spent).",
        Kind::Counter,
    )
    .sample(cancels, "result=\"delivered\"", redis.cancels_delivered)
    .sample(cancels, "result=\"abandoned\"", redis.cancels_abandoned);
    e.gauge(
        "tollgate_store_cancellations_pending",
        "Cancellations still being sent.",
        redis.cancels_pending,
    );
    let owed = "tollgate_store_owed_releases_total";
    e.family(
        owed,
        "Releases and settlements Redis could not take while it was down: sent once it answered, lapsed (the slot or reservation had expired by then: not sent), or dropped (--redis-max-owed-bytes were kept already, or a settlement whose sending failed after it may have run: it frees nothing until max_hold_seconds or its window's end).",
        Kind::Counter,
    )
    .sample(owed, "result=\"sent\"", redis.owed_sent)
    .sample(owed, "result=\"lapsed\"", redis.owed_lapsed)
    .sample(owed, "result=\"dropped\"", redis.owed_dropped);
    e.gauge(
        "tollgate_store_owed_releases",
        "Releases kept while Redis is down, waiting to be sent.",
        redis.owed_pending,
    );
}
