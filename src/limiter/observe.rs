//! What the limiter records about its decisions: per-limit counters with the
//! reference's labels, store and request errors, and one log line per key
//! a bounded log of refusals.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use smallvec::SmallVec;

use super::{Decision, LimitError, Limiter, Planned, REFUSAL_LOG_KEYS, RefusalLog, Request};
use crate::clock::NANOS_PER_SEC;
use crate::metrics::LimitStats;
use crate::store::{Check, StoreError};

/// Shown every request a limiter decides, after the decision and without
/// changing it: the candidate rules, which decide it again on their own
/// memory store ([`Limiter::set_observer`]).
pub(crate) trait Observer: Send + Sync + std::fmt::Debug {
    /// `request` was decided as `decision`.
    fn observe(&self, request: &Request<'_>, decision: &Decision);
}

impl Limiter {
    pub(super) fn count_store_call(
        &self,
        started: Option<std::time::Instant>,
        result: &Result<(), StoreError>,
    ) {
        if let Some(started) = started {
            self.metrics
                .store_call
                .observe(started.elapsed().as_secs_f64());
        }
        let counter = match result {
            Ok(()) => return,
            Err(StoreError::Timeout(_)) => &self.metrics.store_timeout,
            Err(StoreError::CircuitOpen) => &self.metrics.store_circuit_open,
            Err(_) => &self.metrics.store_error,
        };
        counter.fetch_add(1, Relaxed);
    }

    pub(super) fn count_error(&self, error: &LimitError) {
        let counter = match error {
            LimitError::InvalidArgument(_) => &self.metrics.invalid_argument,
            LimitError::Unavailable(_) => &self.metrics.unavailable,
        };
        counter.fetch_add(1, Relaxed);
    }

    /// Per-limit counters, as the reference keeps them.
    pub(super) fn count_decision(
        &self,
        plan: &Planned,
        check: &Check,
        allowed: bool,
        remaining: u32,
    ) {
        // A rule's counters came with its plan; others are found now.
        let found;
        let stats: &LimitStats = match &plan.stats {
            Some(stats) => stats,
            None => {
                found = self.stats(plan, check);
                &found
            }
        };
        let hits = check.hits;
        stats.total_hits.fetch_add(hits, Relaxed);
        if !allowed {
            stats.over_limit.fetch_add(hits, Relaxed);
            if !check.enforced {
                stats.shadow_mode.fetch_add(hits, Relaxed);
            }
            return;
        }
        stats.within_limit.fetch_add(hits, Relaxed);
        let limit = f64::from(plan.limit.requests_per_unit);
        let used = limit - f64::from(remaining);
        if used > limit * self.options.near_limit_ratio {
            stats.near_limit.fetch_add(hits, Relaxed);
        }
    }

    /// The counters for a descriptor planned without them: the rule's
    /// (labels from its path), or,
    /// when the rule opts in with `detailed_metric`/`value_to_metric`, labels
    /// with the request's values. Label sets made from a request are capped
    /// (see [`crate::metrics`]).
    fn stats(&self, plan: &Planned, check: &Check) -> Arc<LimitStats> {
        let detailed = |labels_from_values: bool| {
            let max = self.metrics.max_label_bytes();
            let parts = check.key.parts();
            let keys: SmallVec<[String; 4]> = parts
                .entries
                .iter()
                .map(|(k, v)| {
                    let label = if labels_from_values {
                        format!("{k}_{v}")
                    } else {
                        (*k).to_owned()
                    };
                    crate::metrics::truncated(&label, max).to_owned()
                })
                .collect();
            let mut labels = crate::metrics::metric_labels(
                crate::metrics::truncated(parts.domain, max),
                keys.iter().map(String::as_str),
            );
            // Several limits of one descriptor: one series each.
            if let Some(label) = plan.rule.as_ref().and_then(|r| r.limit_label.as_deref()) {
                crate::metrics::push_label(&mut labels, "limit", label);
            }
            self.metrics.request_limit(&labels)
        };
        match &plan.rule {
            Some(rule) if rule.detailed_metric || rule.value_to_metric => detailed(true),
            // Planned without its snapshot's handle: found by its labels.
            Some(rule) => self.metrics.limit(&super::compiled::labels(rule)),
            // A limit sent in the request: labelled by its keys only.
            None => detailed(false),
        }
    }

    /// Logs a refusal: every descriptor of the request (JSON objects in
    /// JSON logs), the rule and where it is written, the caller's request
    /// and trace ids. Bounded: a key at most once a second, and at most
    /// `--refusal-log-rate` lines a second in all; each line says how many
    /// refusals went unlogged since the one before.
    pub(super) fn log_refusal(
        &self,
        request: &Request<'_>,
        plan: &Planned,
        check: &Check,
        enforced: bool,
    ) {
        let level = self.options.refusal_log;
        // Nothing is built for a line no one reads (the level filtered out).
        let shown = match level {
            RefusalLog::Off => false,
            RefusalLog::Warn => {
                tracing::enabled!(target: crate::logging::REFUSAL_TARGET, tracing::Level::WARN)
            }
            _ => tracing::enabled!(target: crate::logging::REFUSAL_TARGET, tracing::Level::INFO),
        };
        if !shown {
            return;
        }
        let second = self.clock.now() / NANOS_PER_SEC;
        let id = xxhash_rust::xxh3::xxh3_64(check.key.as_bytes());
        // Each thread keeps its own share of the budget: a refusal takes
        // only its own thread's lock, never one every worker shares.
        let shards = self.refusals.len();
        let rate = self.options.refusal_log_rate.div_ceil(shards as u32);
        let not_logged = {
            let mut log = self.refusals.mine();
            match log.admit(id, second, rate, (REFUSAL_LOG_KEYS / shards).max(1)) {
                Some(not_logged) => not_logged,
                None => return,
            }
        };
        // Bounded: a request of many large values must not make a line of
        // half a megabyte (the line rate alone would not stop a flood).
        let descriptor = request
            .descriptors
            .get(plan.descriptor)
            .map_or_else(String::new, |d| {
                cut(entries_json(&d.entries), MAX_LOGGED_DESCRIPTOR_BYTES)
            });
        let descriptors = cut(
            format!(
                "[{}]",
                request
                    .descriptors
                    .iter()
                    .map(|d| entries_json(&d.entries))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            MAX_LOGGED_DESCRIPTORS_BYTES,
        );
        let ids = crate::logging::call_ids().unwrap_or_default();
        // A request id sent as a descriptor entry (how Envoy can send it).
        let request_id = ids.request_id.as_deref().or_else(|| {
            request
                .descriptors
                .iter()
                .flat_map(|d| d.entries.iter())
                .find(|(k, _)| k.eq_ignore_ascii_case("x-request-id"))
                .map(|(_, v)| *v)
        });
        let (rule, source) = match &plan.rule {
            Some(r) => (
                r.path.as_str(),
                format!("{}:{}", r.source.file.display(), r.source.line),
            ),
            None => ("(limit from the request)", String::new()),
        };
        let name = plan.rule.as_ref().and_then(|r| r.name.as_deref());
        macro_rules! refusal {
            ($level:expr) => {
                tracing::event!(
                    target: crate::logging::REFUSAL_TARGET,
                    $level,
                    rule = crate::rules::printable(rule).as_ref(),
                    name = name.map(crate::rules::printable).as_deref(),
                    source = crate::rules::printable(&source).as_ref(),
                    domain = crate::rules::printable(request.domain).as_ref(),
                    descriptor = %descriptor,
                    descriptors = %descriptors,
                    limit = plan.limit.requests_per_unit,
                    unit = plan.limit.unit.name(),
                    algorithm = plan.limit.algorithm.name(),
                    // A bucket's capacity: its limit is a refill rate.
                    burst = (plan.limit.algorithm == crate::algorithm::Algorithm::TokenBucket)
                        .then_some(plan.limit.burst),
                    shadow = !enforced,
                    // A soft limit (`over_limit: tag`): admitted, tagged.
                    soft = plan.soft,
                    request_id = request_id.map(crate::rules::printable).as_deref(),
                    trace_id = ids.trace_id.as_deref(),
                    not_logged,
                    "over the limit"
                )
            };
        }
        match level {
            RefusalLog::Warn => refusal!(tracing::Level::WARN),
            _ => refusal!(tracing::Level::INFO),
        }
    }
}

/// Which refusals were logged lately: a key's last second, and this
/// second's lines.
#[derive(Debug, Default)]
pub(super) struct RefusalsLogged {
    /// Key hash -> the second it was last logged in.
    seen: std::collections::HashMap<u64, u64>,
    second: u64,
    lines: u32,
    /// Refusals not logged since the last line.
    not_logged: u64,
}

impl RefusalsLogged {
    /// Whether a refusal of key `id` in `second` is logged (with the count
    /// of refusals not logged before it), at most `rate` lines a second.
    fn admit(&mut self, id: u64, second: u64, rate: u32, keys: usize) -> Option<u64> {
        if self.second != second {
            self.second = second;
            self.lines = 0;
        }
        if self.seen.get(&id) == Some(&second) || self.lines >= rate {
            self.not_logged += 1;
            return None;
        }
        self.lines += 1;
        if self.seen.len() >= keys {
            self.seen.retain(|_, s| *s >= second);
            if self.seen.len() >= keys {
                self.seen.clear();
            }
        }
        self.seen.insert(id, second);
        Some(std::mem::take(&mut self.not_logged))
    }
}

/// The most bytes of the refused descriptor in a refusal line.
const MAX_LOGGED_DESCRIPTOR_BYTES: usize = 1_024;
/// The most bytes of all the request's descriptors in a refusal line.
const MAX_LOGGED_DESCRIPTORS_BYTES: usize = 2_048;

/// `text` cut to `max` bytes (at a character boundary), saying how much
/// was left out.
fn cut(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let left = text.len() - end;
    text.truncate(end);
    text.push_str(&format!("… ({left} more bytes)"));
    text
}

/// A descriptor's entries as JSON: `[{"key": K, "value": V}, ...]`.
fn entries_json(entries: &[(&str, &str)]) -> String {
    let entries: Vec<serde_json::Value> = entries
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    serde_json::Value::from(entries).to_string()
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn long_descriptors_are_cut_in_the_log_saying_how_much() {
        let long = "é".repeat(3_000);
        let cut = super::cut(long.clone(), 1_001);
        assert!(cut.len() < 1_100, "{}", cut.len());
        assert!(
            cut.ends_with(&format!("… ({} more bytes)", long.len() - 1_000)),
            "{cut}"
        );
        assert_eq!(super::cut("short".into(), 10), "short");
    }

    #[test]
    fn a_key_is_logged_once_a_second_and_lines_are_bounded() {
        let mut log = RefusalsLogged::default();
        assert_eq!(log.admit(1, 10, 2, REFUSAL_LOG_KEYS), Some(0));
        assert_eq!(
            log.admit(1, 10, 2, REFUSAL_LOG_KEYS),
            None,
            "the same key, the same second"
        );
        assert_eq!(log.admit(2, 10, 2, REFUSAL_LOG_KEYS), Some(1));
        assert_eq!(
            log.admit(3, 10, 2, REFUSAL_LOG_KEYS),
            None,
            "two lines this second"
        );
        assert_eq!(
            log.admit(1, 11, 2, REFUSAL_LOG_KEYS),
            Some(1),
            "a new second: one went unlogged since the last line"
        );
        for id in 0..1_000u64 {
            log.admit(id, 12, 100, REFUSAL_LOG_KEYS);
        }
        assert_eq!(log.lines, 100);
    }
}
