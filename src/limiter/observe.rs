//! What the limiter records about its decisions: per-limit counters with the
//! reference's labels, store and request errors, and one log line per key
//! and window for refusals.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use smallvec::SmallVec;

use super::{Decision, LimitError, Limiter, Planned, REFUSAL_LOG_KEYS, Request};
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
        started: std::time::Instant,
        result: &Result<(), StoreError>,
    ) {
        self.metrics
            .store_call
            .observe(started.elapsed().as_secs_f64());
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
        let stats = self.stats(plan, check);
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

    /// The counters for a descriptor: the rule's (labels from its path), or,
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
            Some(rule) => rule
                .stats
                .get_or_init(|| self.metrics.limit(&rule.metric_labels))
                .clone(),
            // A limit sent in the request: labelled by its keys only.
            None => detailed(false),
        }
    }

    /// Logs the first refusal of a key in each window; later ones in the same
    /// window are only counted, so a flood cannot flood the logs.
    pub(super) fn log_refusal(&self, plan: &Planned, check: &Check, enforced: bool) {
        let id = xxhash_rust::xxh3::xxh3_64(check.key.as_bytes());
        let window = check.quota.window_at(self.clock.now()).index;
        {
            let mut seen = self.refusals.lock();
            if seen.get(&id) == Some(&window) {
                return;
            }
            if seen.len() >= REFUSAL_LOG_KEYS {
                seen.retain(|_, w| *w >= window);
                if seen.len() >= REFUSAL_LOG_KEYS {
                    seen.clear();
                }
            }
            seen.insert(id, window);
        }
        let parts = check.key.parts();
        let rule = plan
            .rule
            .as_ref()
            .map_or("(limit from the request)", |r| r.path.as_str());
        tracing::info!(
            rule,
            domain = parts.domain,
            descriptor = ?parts.entries,
            limit = plan.limit.requests_per_unit,
            unit = plan.limit.unit.name(),
            shadow = !enforced,
            "over the limit (first refusal for this key in this window; later ones are only counted)"
        );
    }
}
