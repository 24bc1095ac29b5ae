//! One replay: every event through a production [`Limiter`] (the same rule
//! loader, matcher, algorithms and memory store that `serve` uses) on a
//! simulated clock, counting per rule.

use std::borrow::Borrow;
use std::sync::Arc;

use smallvec::SmallVec;

use super::traffic::{Entries, Event};
use crate::clock::{ManualClock, NANOS_PER_SEC, Nanos};
use crate::limiter::{Descriptor, Limiter, LimiterOptions, Request};
use crate::report::{Bin, RuleResult, ScenarioResult};
use crate::rules::RuleSet;
use crate::store::{MemoryStoreOptions, Store};

/// The most distinct refused clients remembered per rule; past it refusals
/// of new clients count under "(others)".
const MAX_CLIENTS: usize = 100_000;

struct Tracking {
    result: RuleResult,
    /// Refusals by client (the refused descriptor's entries, shared with
    /// the traffic: no text is made until the report).
    clients: hashbrown::HashMap<Entries, u64>,
    /// Refusals of clients past [`MAX_CLIENTS`].
    others: u64,
    limit: u32,
}

/// Replays `events` (sorted by time, the first at `start`, the last at
/// `end`) under `rules`, counting in bins of `bin` nanoseconds from the
/// first event. `progress` is told how many events are done, now and then.
pub(crate) fn replay<E: Borrow<Event>>(
    scenario: &str,
    rules: RuleSet,
    events: impl IntoIterator<Item = E>,
    (start, end): (Nanos, Nanos),
    bin: Nanos,
    progress: &dyn Fn(u64),
) -> ScenarioResult {
    let bins = ((end - start) / bin.max(1) + 1) as usize;
    let clock = ManualClock::new(start);
    // What is tracked for each rule with a limit, by the rule's index
    // (which each applied limit names).
    let mut by_rule: Vec<Option<usize>> = vec![None; rules.rules().len()];
    let mut tracking: Vec<Tracking> = Vec::new();
    for rule in rules.rules() {
        let Some(limit) = rule.limit else { continue };
        by_rule[rule.index] = Some(tracking.len());
        tracking.push(Tracking {
            result: RuleResult {
                rule: rule.path.clone(),
                name: rule.name.clone(),
                limit: limit.summary(),
                limit_per_second: f64::from(limit.requests_per_unit)
                    / limit.period_seconds() as f64,
                requests: 0,
                admitted: 0,
                refused: 0,
                tagged: 0,
                peak_usage: 0.0,
                top_refused: Vec::new(),
                series: vec![Bin::default(); bins],
            },
            clients: hashbrown::HashMap::new(),
            others: 0,
            limit: limit.requests_per_unit,
        });
    }
    let limiter = Limiter::new(
        rules,
        Store::memory(MemoryStoreOptions::default()),
        Arc::new(clock.clone()),
        LimiterOptions {
            response_headers: false,
            // A replay reports refusals itself, and its clock is simulated.
            refusal_log: crate::limiter::RefusalLog::Off,
            timed: false,
            ..LimiterOptions::default()
        },
    );
    let (mut requests, mut refused) = (0u64, 0u64);
    let (mut not_replayed, mut not_replayed_why) = (0u64, None::<String>);
    let mut n = 0u64;
    for event in events {
        let event = event.borrow();
        if n.is_multiple_of(65_536) {
            progress(n);
        }
        n += 1;
        clock.set(event.at);
        let request = Request {
            domain: &event.domain,
            descriptors: event
                .descriptors
                .iter()
                .map(|d| Descriptor {
                    entries: d.iter().map(|(k, v)| (&**k, &**v)).collect(),
                    limit_override: None,
                    hits_addend: None,
                })
                .collect(),
            hits_addend: event.hits,
        };
        // The memory store always answers at once.
        let decision = match limiter.decide_now(&request) {
            Some(Ok(decision)) => decision,
            Some(Err(e)) => {
                not_replayed += 1;
                not_replayed_why.get_or_insert_with(|| e.to_string());
                continue;
            }
            None => continue,
        };
        requests += 1;
        refused += u64::from(decision.over_limit);
        let slot = ((event.at - start) / bin.max(1)) as usize;
        for (i, status) in decision.statuses.iter().enumerate() {
            for (applied, over, remaining, _, tagged) in status.limits() {
                let Some(t) = applied.rule.and_then(|i| by_rule.get(i).copied().flatten()) else {
                    continue;
                };
                let t = &mut tracking[t];
                let r = &mut t.result;
                r.requests += 1;
                r.series[slot].requests += 1;
                if over {
                    r.refused += 1;
                    r.series[slot].refused += 1;
                    let client = &event.descriptors[i];
                    let tracked = t.clients.len();
                    match t.clients.get_mut(client) {
                        Some(c) => *c += 1,
                        None if tracked < MAX_CLIENTS => {
                            t.clients.insert(client.clone(), 1);
                        }
                        None => t.others += 1,
                    }
                } else {
                    r.admitted += 1;
                }
                // Over a soft limit: admitted, and counted as over it.
                if tagged {
                    r.tagged += 1;
                    r.series[slot].tagged += 1;
                }
                if t.limit > 0 {
                    let used = f64::from(t.limit.saturating_sub(remaining)) / f64::from(t.limit);
                    if used > r.peak_usage {
                        r.peak_usage = used;
                    }
                } else {
                    r.peak_usage = 1.0;
                }
            }
        }
    }
    progress(n);
    let rules = tracking
        .into_iter()
        .filter(|t| t.result.requests > 0)
        .map(|mut t| {
            let mut top: Vec<(String, u64)> = t
                .clients
                .iter()
                .map(|(client, &n)| (entries_text(client), n))
                .collect();
            if t.others > 0 {
                top.push(("(others)".into(), t.others));
            }
            top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            top.truncate(10);
            t.result.top_refused = top;
            t.result
        })
        .collect();
    ScenarioResult {
        scenario: scenario.into(),
        requests,
        refused,
        rules,
        bin_seconds: bin as f64 / NANOS_PER_SEC as f64,
        start: start as f64 / NANOS_PER_SEC as f64,
        not_replayed,
        not_replayed_why,
    }
}

/// `key=value,key=value` of a descriptor.
fn entries_text(entries: &[(Arc<str>, Arc<str>)]) -> String {
    let parts: SmallVec<[String; 4]> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join(",")
}

/// A bin width that gives at most `most` bins over `span`: 1 ms to 1 h in
/// steps people read (1, 2, 5, 10, 15, 30 ...).
pub(crate) fn bin_for(span: Nanos, most: u64) -> Nanos {
    const STEPS_MS: [u64; 20] = [
        1, 10, 100, 250, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000,
        300_000, 600_000, 900_000, 1_800_000, 3_600_000, 21_600_000, 86_400_000,
    ];
    STEPS_MS
        .iter()
        .map(|ms| ms * 1_000_000)
        .find(|step| span / step < most)
        .unwrap_or(86_400 * NANOS_PER_SEC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_over_a_soft_limit_are_counted_over_it_and_admitted() {
        let rules = RuleSet::from_yaml(
            "domain: d
descriptors:
  - key: user
    over_limit: tag
    rate_limit: {name: soft, unit: minute, requests_per_unit: 2}
  - key: org
    rate_limit: {name: hard, unit: minute, requests_per_unit: 2}
",
        )
        .expect("rules");
        let start = 1_000 * 60 * NANOS_PER_SEC;
        let event = |i: u64, key: &str| Event {
            at: start + i * NANOS_PER_SEC,
            domain: Arc::from("d"),
            descriptors: smallvec::smallvec![smallvec::smallvec![(Arc::from(key), Arc::from("a"))]],
            hits: 0,
        };
        let events: Vec<Event> = (0..5)
            .map(|i| event(i, "user"))
            .chain((5..10).map(|i| event(i, "org")))
            .collect();
        let end = events.last().map_or(start, |e| e.at);
        let result = replay("s", rules, &events, (start, end), NANOS_PER_SEC, &|_| {});
        let rule = |name: &str| {
            result
                .rules
                .iter()
                .find(|r| r.name.as_deref() == Some(name))
                .expect("rule")
        };
        let soft = rule("soft");
        assert_eq!(
            (soft.requests, soft.admitted, soft.refused, soft.tagged),
            (5, 5, 0, 3)
        );
        assert_eq!(soft.series.iter().map(|b| b.tagged).sum::<u64>(), 3);
        let hard = rule("hard");
        assert_eq!((hard.admitted, hard.refused, hard.tagged), (2, 3, 0));
        assert_eq!(result.refused, 3, "only the hard limit refused");
        let text = crate::report::summary_text(std::slice::from_ref(&result));
        assert!(
            text.contains("over its soft limit (over_limit: tag), admitted and tagged: 3 (60.0 %)"),
            "{text}"
        );
    }
}
