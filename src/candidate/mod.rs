//! Candidate rules (`serve --candidate-rules PATH`): a second rule set
//! evaluated beside the live one for every request, with its own counters
//! in its own memory store, never affecting the answer. What it would have
//! refused is counted per rule (`tollgate_candidate_*` metrics), kept over
//! the last hour in 10-second bins, and shown on the admin port's
//! `/candidate` (JSON) and `/candidate/report.html` (the offline report's
//! plots).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::{Clock, NANOS_PER_SEC, Nanos};
use crate::limiter::{Decision, Limiter, LimiterOptions, Observer, Request};
use crate::metrics::candidate::{CandidateMetrics, CandidateRule};
use crate::report::{Bin, RuleResult, ScenarioResult};
use crate::rules::RuleSet;
use crate::shards::PerThread;
use crate::store::{MemoryStoreOptions, Store};

/// Width of the kept bins.
const BIN: Nanos = 10 * NANOS_PER_SEC;
/// Bins kept: one hour.
const BINS: usize = 360;
/// The most rules tracked (limits sent in requests could make more).
const MAX_RULES: usize = 10_000;
/// The most rules drawn in `/candidate/report.html` (those that refused
/// most): the page stays a few hundred kilobytes whatever the rule count.
const REPORT_RULES: usize = 50;
/// How long a rendered report is served again (one bin).
const REPORT_FOR: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug, Default)]
struct RuleCounts {
    limit_per_second: f64,
    limit: String,
    requests: u64,
    refused: u64,
    /// `(bin number, counts, the highest share of the limit used)`, oldest
    /// first.
    bins: VecDeque<(u64, Bin, f64)>,
}

#[derive(Debug, Default)]
struct Counts {
    rules: BTreeMap<Arc<str>, RuleCounts>,
    /// Requests (each once, whatever its rules) and those the candidate
    /// rules refused, per bin, oldest first.
    requests: VecDeque<(u64, Bin)>,
    /// Requests both rule sets answered alike, the candidate refused and the
    /// live rules admitted, and the other way round.
    same: u64,
    stricter: u64,
    looser: u64,
}

impl Counts {
    /// Adds `other` (another thread's counts) to these: totals summed, bins
    /// of the same number summed (their peaks: the higher), at most
    /// [`MAX_RULES`] rules.
    fn merge(&mut self, other: &Counts) {
        self.same += other.same;
        self.stricter += other.stricter;
        self.looser += other.looser;
        merge_bins(
            &mut self.requests,
            &other.requests,
            |(b, _)| *b,
            |(_, a), (_, o)| {
                a.requests += o.requests;
                a.refused += o.refused;
            },
        );
        for (rule, theirs) in &other.rules {
            let full = self.rules.len() >= MAX_RULES;
            let ours = match self.rules.get_mut(rule) {
                Some(ours) => ours,
                None if full => continue,
                None => self
                    .rules
                    .entry(rule.clone())
                    .or_insert_with(|| RuleCounts {
                        limit_per_second: theirs.limit_per_second,
                        limit: theirs.limit.clone(),
                        ..RuleCounts::default()
                    }),
            };
            ours.requests += theirs.requests;
            ours.refused += theirs.refused;
            merge_bins(
                &mut ours.bins,
                &theirs.bins,
                |(b, _, _)| *b,
                |(_, a, ap), (_, o, op)| {
                    a.requests += o.requests;
                    a.refused += o.refused;
                    *ap = ap.max(*op);
                },
            );
        }
    }
}

/// Merges two runs of bins, each oldest first, into `ours` (still oldest
/// first): `add` folds a bin of `theirs` into ours of the same number.
fn merge_bins<T: Clone>(
    ours: &mut VecDeque<T>,
    theirs: &VecDeque<T>,
    number: impl Fn(&T) -> u64,
    add: impl Fn(&mut T, &T),
) {
    if theirs.is_empty() {
        return;
    }
    let mut by_number: BTreeMap<u64, T> = ours.drain(..).map(|b| (number(&b), b)).collect();
    for bin in theirs {
        match by_number.entry(number(bin)) {
            std::collections::btree_map::Entry::Occupied(mut ours) => add(ours.get_mut(), bin),
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(bin.clone());
            }
        }
    }
    *ours = by_number.into_values().collect();
}

/// The candidate rules and what they would have done.
#[derive(Debug)]
pub(crate) struct Candidate {
    limiter: Arc<Limiter>,
    /// Each thread counts in its own shard (no lock shared by the workers
    /// on the hot path); readers merge them.
    counts: PerThread<Counts>,
    /// The last report rendered, and when: concurrent and repeated requests
    /// within [`REPORT_FOR`] share it.
    report: Mutex<Option<(std::time::Instant, Arc<str>)>>,
}

impl Candidate {
    /// Candidate `rules`, on their own memory store (bounded as the live
    /// one is: `store`) with `clock`.
    pub(crate) fn new(
        rules: RuleSet,
        clock: Arc<dyn Clock>,
        options: LimiterOptions,
        store: MemoryStoreOptions,
    ) -> Self {
        let limiter = Arc::new(Limiter::new(
            rules,
            Store::memory(store),
            clock,
            LimiterOptions {
                response_headers: false,
                shadow_mode: false,
                ..options
            },
        ));
        Self {
            limiter,
            counts: PerThread::new(),
            report: Mutex::new(None),
        }
    }

    /// The candidate limiter (for reloads and its sweep).
    pub(crate) fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Decides `request` under the candidate rules, and counts it against
    /// the live answer (`live_refused`).
    pub(crate) fn compare(&self, request: &Request<'_>, live_refused: bool) {
        // The memory store always answers at once.
        let Some(Ok(decision)) = self.limiter.decide_now(request) else {
            return;
        };
        let now = self.limiter.clock().now();
        self.count(&decision, live_refused, now);
    }

    fn count(&self, decision: &Decision, live_refused: bool, now: Nanos) {
        let bin = now / BIN;
        let mut counts = self.counts.mine();
        match (decision.over_limit, live_refused) {
            (true, false) => counts.stricter += 1,
            (false, true) => counts.looser += 1,
            _ => counts.same += 1,
        }
        if counts.requests.back().is_none_or(|(b, _)| *b != bin) {
            counts.requests.push_back((bin, Bin::default()));
        }
        while counts
            .requests
            .front()
            .is_some_and(|(b, _)| *b + (BINS as u64) <= bin)
        {
            counts.requests.pop_front();
        }
        if let Some((_, b)) = counts.requests.back_mut() {
            b.requests += 1;
            b.refused += u64::from(decision.over_limit);
        }
        for status in &decision.statuses {
            for (applied, over, remaining, _, tagged) in status.limits() {
                // A client's own limit override is no candidate rule.
                if applied.from_request {
                    continue;
                }
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
                if rule.bins.back().is_none_or(|(b, _, _)| *b != bin) {
                    rule.bins.push_back((bin, Bin::default(), 0.0));
                }
                while rule
                    .bins
                    .front()
                    .is_some_and(|(b, _, _)| *b + (BINS as u64) <= bin)
                {
                    rule.bins.pop_front();
                }
                let used = match applied.requests_per_unit {
                    0 => 1.0,
                    limit => f64::from(limit.saturating_sub(remaining)) / f64::from(limit),
                };
                if let Some((_, counts, peak)) = rule.bins.back_mut() {
                    counts.requests += 1;
                    counts.refused += u64::from(over);
                    counts.tagged += u64::from(tagged);
                    *peak = peak.max(used);
                }
            }
        }
    }

    /// Every thread's counts, added up.
    fn merged(&self) -> Counts {
        let mut all = Counts::default();
        self.counts.each(|shard| all.merge(shard));
        all
    }

    /// The candidate rules' numbers for `/metrics` (rendered by
    /// [`crate::metrics::candidate`]).
    pub(crate) fn metrics_snapshot(&self) -> CandidateMetrics {
        let counts = self.merged();
        CandidateMetrics {
            rules: counts
                .rules
                .iter()
                .map(|(rule, c)| CandidateRule {
                    rule: rule.to_string(),
                    requests: c.requests,
                    refused: c.refused,
                })
                .collect(),
            same: counts.same,
            stricter: counts.stricter,
            looser: counts.looser,
        }
    }

    /// The last hour as a simulation outcome (bins of 10 s ending now):
    /// every rule, or the `most` that refused most.
    pub(crate) fn outcome(&self) -> ScenarioResult {
        self.outcome_of(usize::MAX)
    }

    fn outcome_of(&self, most: usize) -> ScenarioResult {
        let now_bin = self.limiter.clock().now() / BIN;
        let first = (now_bin + 1).saturating_sub(BINS as u64);
        let counts = self.merged();
        let in_hour = |b: u64| {
            b.checked_sub(first)
                .map(|s| s as usize)
                .filter(|s| *s < BINS)
        };
        let mut rules: Vec<RuleResult> = counts
            .rules
            .iter()
            .map(|(rule, c)| {
                let mut series = vec![Bin::default(); BINS];
                let mut peak: f64 = 0.0;
                for (b, bin, used) in &c.bins {
                    if let Some(slot) = in_hour(*b) {
                        series[slot] = *bin;
                        peak = peak.max(*used);
                    }
                }
                let (r, f) = series
                    .iter()
                    .fold((0, 0), |(r, f), b| (r + b.requests, f + b.refused));
                let tagged = series.iter().map(|b| b.tagged).sum();
                RuleResult {
                    rule: rule.to_string(),
                    name: None,
                    limit: c.limit.clone(),
                    limit_per_second: c.limit_per_second,
                    requests: r,
                    admitted: r - f,
                    refused: f,
                    tagged,
                    peak_usage: peak,
                    top_refused: Vec::new(),
                    series,
                }
            })
            .collect();
        if rules.len() > most {
            rules.sort_by(|a, b| b.refused.cmp(&a.refused).then(b.requests.cmp(&a.requests)));
            rules.truncate(most);
        }
        // Requests, each once, whatever the number of its rules.
        let (requests, refused) = counts
            .requests
            .iter()
            .filter(|(b, _)| in_hour(*b).is_some())
            .fold((0, 0), |(r, f), (_, b)| (r + b.requests, f + b.refused));
        ScenarioResult {
            scenario: "candidate rules, last hour".into(),
            requests,
            refused,
            rules,
            bin_seconds: (BIN / NANOS_PER_SEC) as f64,
            start: (first * BIN / NANOS_PER_SEC) as f64,
            not_replayed: 0,
            not_replayed_why: None,
        }
    }

    /// `/candidate`: totals since start and the last hour, per rule.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let hour = self.outcome();
        let counts = self.merged();
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

    /// `/candidate/report.html`: the last hour's plots, of the
    /// [`REPORT_RULES`] rules that refused most, rendered at most once per
    /// [`REPORT_FOR`] (requests meanwhile get the same page).
    pub(crate) fn report_html(&self) -> Arc<str> {
        let mut cached = self.report.lock();
        if let Some((at, page)) = cached.as_ref()
            && at.elapsed() < REPORT_FOR
        {
            return page.clone();
        }
        let outcome = self.outcome_of(REPORT_RULES);
        let tracked = self.merged().rules.len();
        let mut page = crate::report::report_html(&[outcome]);
        if tracked > REPORT_RULES {
            let note = format!(
                "<p>The {REPORT_RULES} rules that refused most of {tracked} are shown; /candidate lists them all.</p>"
            );
            match page.find("<body>") {
                Some(i) => page.insert_str(i + "<body>".len(), &note),
                None => page.push_str(&note),
            }
        }
        let page: Arc<str> = page.into();
        *cached = Some((std::time::Instant::now(), page.clone()));
        page
    }
}

/// The live limiter shows the candidate rules every request it decides.
impl Observer for Candidate {
    fn observe(&self, request: &Request<'_>, decision: &Decision) {
        self.compare(request, decision.over_limit);
    }
}

#[cfg(test)]
mod tests;
