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
            for (applied, over, remaining, _) in status.limits() {
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
                RuleResult {
                    rule: rule.to_string(),
                    name: None,
                    limit: c.limit.clone(),
                    limit_per_second: c.limit_per_second,
                    requests: r,
                    admitted: r - f,
                    refused: f,
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
mod tests {
    use std::path::PathBuf;

    use smallvec::smallvec;

    use super::*;
    use crate::clock::ManualClock;
    use crate::limiter::{Descriptor, LimitOverride};
    use crate::rules::{LoadOptions, Unit, load_sources};

    const START: Nanos = 1_700_000_000 * NANOS_PER_SEC;

    fn candidate(yaml: &str, max_keys: usize) -> (Candidate, Arc<ManualClock>) {
        let rules = load_sources(
            &[(PathBuf::from("c.yaml"), yaml.to_owned())],
            &LoadOptions::default(),
        )
        .expect("rules");
        let clock = Arc::new(ManualClock::new(START));
        let store = MemoryStoreOptions {
            max_keys,
            ..MemoryStoreOptions::default()
        };
        let c = Candidate::new(rules, clock.clone(), LimiterOptions::default(), store);
        (c, clock)
    }

    fn request<'a>(user: &'a str, org: &'a str) -> Request<'a> {
        Request {
            domain: "d",
            descriptors: smallvec![
                Descriptor {
                    entries: smallvec![("user", user)],
                    ..Descriptor::default()
                },
                Descriptor {
                    entries: smallvec![("org", org)],
                    ..Descriptor::default()
                },
            ],
            hits_addend: 0,
        }
    }

    const TWO_RULES: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: org\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

    /// Issue 22: 19 requests of two rules each, 9 refused, were reported
    /// as "22 requests, 0 refused" (hits per rule, refused never counted)
    /// with a peak of 0 %.
    #[test]
    fn totals_count_requests_once_and_their_refusals() {
        let (c, _) = candidate(TWO_RULES, 1_000);
        for _ in 0..19 {
            c.compare(&request("ann", "acme"), false);
        }
        let outcome = c.outcome();
        assert_eq!(outcome.requests, 19);
        assert_eq!(outcome.refused, 9);
        let user = outcome
            .rules
            .iter()
            .find(|r| r.rule == "d.user")
            .expect("rule");
        assert_eq!((user.requests, user.refused), (19, 9));
        assert!((user.peak_usage - 1.0).abs() < 1e-9, "{}", user.peak_usage);
        let org = outcome
            .rules
            .iter()
            .find(|r| r.rule == "d.org")
            .expect("rule");
        assert!((org.peak_usage - 0.01).abs() < 1e-9, "{}", org.peak_usage);
    }

    /// The workers count apart (no shared lock) and every reader sees their
    /// sum: bins of the same 10 s from two threads are one bin.
    #[test]
    fn counts_from_several_threads_are_merged_on_read() {
        let (c, clock) = candidate(TWO_RULES, 1_000);
        let c = Arc::new(c);
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let user = format!("user{t}");
                    for _ in 0..15 {
                        c.compare(&request(&user, "acme"), false);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        clock.advance(std::time::Duration::from_secs(10));
        c.compare(&request("user0", "acme"), true);
        let outcome = c.outcome();
        assert_eq!((outcome.requests, outcome.refused), (46, 16));
        let user = outcome
            .rules
            .iter()
            .find(|r| r.rule == "d.user")
            .expect("rule");
        assert_eq!((user.requests, user.refused), (46, 16));
        let busy: Vec<_> = user.series.iter().filter(|b| b.requests > 0).collect();
        assert_eq!(busy.len(), 2, "two bins: {busy:?}");
        assert_eq!((busy[0].requests, busy[0].refused), (45, 15));
        let json = c.to_json();
        assert_eq!(json["decisions"]["stricter"], 15);
        assert_eq!(json["decisions"]["same"], 31);
    }

    #[test]
    fn a_clients_limit_override_is_no_candidate_rule() {
        let (c, _) = candidate(TWO_RULES, 1_000);
        let mut r = request("ann", "acme");
        r.descriptors[0].limit_override = Some(LimitOverride {
            requests_per_unit: 5,
            unit: Unit::Minute,
        });
        c.compare(&r, false);
        let rules: Vec<String> = c.outcome().rules.into_iter().map(|r| r.rule).collect();
        assert_eq!(rules, ["d.org"], "no 'override' row");
    }

    #[test]
    fn the_candidate_store_keeps_the_live_stores_key_bound() {
        let (c, _) = candidate(TWO_RULES, 1_000);
        let users: Vec<String> = (0..5_000).map(|i| format!("u{i}")).collect();
        for user in &users {
            c.compare(&request(user, "acme"), false);
        }
        let store = c.limiter().store().as_memory().expect("a memory store");
        // The bound is per shard (max_keys / 256 shards, rounded up).
        assert!(store.len() <= 1_024, "{} keys of 5,001", store.len());
    }

    #[test]
    fn the_report_is_bounded_and_rendered_once_per_bin() {
        let mut yaml = String::from("domain: d\ndescriptors:\n");
        for i in 0..5_000 {
            yaml.push_str(&format!(
                "  - key: user\n    value: u{i}\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
            ));
        }
        let (c, _) = candidate(&yaml, 1_000_000);
        let users: Vec<String> = (0..5_000).map(|i| format!("u{i}")).collect();
        for user in &users {
            c.compare(&request(user, "x"), false);
            c.compare(&request(user, "x"), false);
        }
        let started = std::time::Instant::now();
        let page = c.report_html();
        assert!(page.len() < 2_000_000, "{} bytes", page.len());
        assert_eq!(page.matches("<svg").count(), REPORT_RULES);
        assert!(page.contains("of 5000 are shown"), "the note");
        let again = c.report_html();
        assert!(
            Arc::ptr_eq(&page, &again),
            "served again, not rendered again"
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
}
