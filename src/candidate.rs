//! Candidate rules (`serve --candidate-rules PATH`): a second rule set
//! evaluated beside the live one for every request, with its own counters
//! in its own memory store, never affecting the answer. What it would have
//! refused is counted per rule (`tollgate_candidate_*` metrics), kept over
//! the last hour in 10-second bins, and shown on the admin port's
//! `/candidate` (JSON) and `/candidate/report.html` (the offline report's
//! plots).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::{Clock, NANOS_PER_SEC, Nanos};
use crate::limiter::{Decision, Limiter, LimiterOptions, Request};
use crate::rules::RuleSet;
use crate::simulate::replay::{Bin, Outcome, RuleResult};
use crate::store::{MemoryStore, MemoryStoreOptions, Store};

/// Width of the kept bins.
const BIN: Nanos = 10 * NANOS_PER_SEC;
/// Bins kept: one hour.
const BINS: usize = 360;
/// The most rules tracked (limits sent in requests could make more).
const MAX_RULES: usize = 10_000;

#[derive(Debug, Default)]
struct RuleCounts {
    limit_per_second: f64,
    limit: String,
    requests: u64,
    refused: u64,
    /// `(bin number, counts)`, oldest first.
    bins: VecDeque<(u64, Bin)>,
}

#[derive(Debug, Default)]
struct Counts {
    rules: BTreeMap<Arc<str>, RuleCounts>,
    /// Requests both rule sets answered alike, the candidate refused and the
    /// live rules admitted, and the other way round.
    same: u64,
    stricter: u64,
    looser: u64,
}

/// The candidate rules and what they would have done.
#[derive(Debug)]
pub struct Candidate {
    limiter: Arc<Limiter>,
    counts: Mutex<Counts>,
}

impl Candidate {
    /// Candidate `rules`, on their own memory store with `clock`.
    pub fn new(rules: RuleSet, clock: Arc<dyn Clock>, options: LimiterOptions) -> Self {
        let limiter = Arc::new(Limiter::new(
            rules,
            Store::Memory(MemoryStore::new(MemoryStoreOptions::default())),
            clock,
            LimiterOptions {
                response_headers: false,
                shadow_mode: false,
                ..options
            },
        ));
        Self {
            limiter,
            counts: Mutex::new(Counts::default()),
        }
    }

    /// The candidate limiter (for reloads and its sweep).
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Decides `request` under the candidate rules, and counts it against
    /// the live answer (`live_refused`).
    pub fn observe(&self, request: &Request<'_>, live_refused: bool) {
        // The memory store always answers at once.
        let Some(Ok(decision)) = self.limiter.decide_now(request) else {
            return;
        };
        let now = self.limiter.clock().now();
        self.count(&decision, live_refused, now);
    }

    fn count(&self, decision: &Decision, live_refused: bool, now: Nanos) {
        let bin = now / BIN;
        let mut counts = self.counts.lock();
        match (decision.over_limit, live_refused) {
            (true, false) => counts.stricter += 1,
            (false, true) => counts.looser += 1,
            _ => counts.same += 1,
        }
        for status in &decision.statuses {
            for (applied, over, _, _) in status.limits() {
                let full = counts.rules.len() >= MAX_RULES;
                let rule = match counts.rules.get_mut(&applied.policy) {
                    Some(rule) => rule,
                    None if full => continue,
                    None => counts
                        .rules
                        .entry(applied.policy.clone())
                        .or_insert_with(|| RuleCounts {
                            limit_per_second: f64::from(applied.requests_per_unit)
                                / applied.window_seconds.max(1) as f64,
                            limit: format!(
                                "{}/{}s",
                                applied.requests_per_unit, applied.window_seconds
                            ),
                            ..RuleCounts::default()
                        }),
                };
                rule.requests += 1;
                rule.refused += u64::from(over);
                if rule.bins.back().is_none_or(|(b, _)| *b != bin) {
                    rule.bins.push_back((bin, Bin::default()));
                }
                while rule
                    .bins
                    .front()
                    .is_some_and(|(b, _)| *b + (BINS as u64) <= bin)
                {
                    rule.bins.pop_front();
                }
                if let Some((_, counts)) = rule.bins.back_mut() {
                    counts.requests += 1;
                    counts.refused += u64::from(over);
                }
            }
        }
    }

    /// The `tollgate_candidate_*` metrics.
    pub fn render_metrics(&self, out: &mut String) {
        let counts = self.counts.lock();
        // (name, help, value of one rule's counts)
        type Series = (&'static str, &'static str, fn(&RuleCounts) -> u64);
        let per_rule: [Series; 2] = [
            (
                "tollgate_candidate_requests_total",
                "Hits the candidate rules matched, per rule.",
                |c| c.requests,
            ),
            (
                "tollgate_candidate_refused_total",
                "Hits the candidate rules would have refused, per rule.",
                |c| c.refused,
            ),
        ];
        for (name, help, value) in per_rule {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (rule, c) in &counts.rules {
                let mut labels = String::new();
                crate::metrics::push_label(&mut labels, "rule", rule);
                let _ = writeln!(out, "{name}{{{}}} {}", &labels[1..], value(c));
            }
        }
        let _ = writeln!(
            out,
            "# HELP tollgate_candidate_decisions_total Requests by how the candidate rules would have answered them against the live rules.\n# TYPE tollgate_candidate_decisions_total counter"
        );
        for (outcome, n) in [
            ("same", counts.same),
            ("stricter", counts.stricter),
            ("looser", counts.looser),
        ] {
            let _ = writeln!(
                out,
                "tollgate_candidate_decisions_total{{outcome=\"{outcome}\"}} {n}"
            );
        }
    }

    /// The last hour as a simulation outcome (bins of 10 s ending now).
    pub fn outcome(&self) -> Outcome {
        let now_bin = self.limiter.clock().now() / BIN;
        let first = (now_bin + 1).saturating_sub(BINS as u64);
        let counts = self.counts.lock();
        let mut requests = 0;
        let rules = counts
            .rules
            .iter()
            .map(|(rule, c)| {
                let mut series = vec![Bin::default(); BINS];
                for (b, bin) in &c.bins {
                    if let Some(slot) = b
                        .checked_sub(first)
                        .map(|s| s as usize)
                        .filter(|s| *s < BINS)
                    {
                        series[slot] = *bin;
                    }
                }
                let (r, f) = series
                    .iter()
                    .fold((0, 0), |(r, f), b| (r + b.requests, f + b.refused));
                requests += r;
                RuleResult {
                    rule: rule.to_string(),
                    name: None,
                    limit: c.limit.clone(),
                    limit_per_second: c.limit_per_second,
                    requests: r,
                    admitted: r - f,
                    refused: f,
                    peak_usage: 0.0,
                    top_refused: Vec::new(),
                    series,
                }
            })
            .collect();
        Outcome {
            scenario: "candidate rules, last hour".into(),
            requests,
            refused: 0,
            rules,
            bin_seconds: (BIN / NANOS_PER_SEC) as f64,
            start: (first * BIN / NANOS_PER_SEC) as f64,
        }
    }

    /// `/candidate`: totals since start and the last hour, per rule.
    pub fn to_json(&self) -> serde_json::Value {
        let hour = self.outcome();
        let counts = self.counts.lock();
        let rules: Vec<serde_json::Value> = counts
            .rules
            .iter()
            .map(|(rule, c)| {
                let last = hour.rules.iter().find(|r| r.rule == **rule);
                serde_json::json!({
                    "rule": &**rule,
                    "limit": c.limit,
                    "requests": c.requests,
                    "refused": c.refused,
                    "admitted": c.requests - c.refused,
                    "last_hour": {
                        "requests": last.map_or(0, |r| r.requests),
                        "refused": last.map_or(0, |r| r.refused),
                    },
                })
            })
            .collect();
        serde_json::json!({
            "rules": rules,
            "decisions": {"same": counts.same, "stricter": counts.stricter, "looser": counts.looser},
        })
    }

    /// `/candidate/report.html`: the last hour's plots.
    pub fn report_html(&self) -> String {
        crate::simulate::report::report_html(&[self.outcome()])
    }
}
