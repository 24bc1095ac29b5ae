//! Sliding log: every admitted request is kept with its time and hits, and a
//! request is admitted only if the hits admitted in the last period, its own
//! added, fit in the limit. Exact (never more than the limit in any span of
//! one period), at the price of memory: one entry per admitted request still
//! inside the period, so rules bound its limit (`--max-sliding-log`).
//!
//! The log is kept oldest first. An entry is inside the period at `now`
//! while `at > now - period`; it leaves at `at + period`. A commit is an
//! append: the outcome's state says when (`at`) and how many hits
//! (`current`), and the store prunes what has left and adds it (see
//! [`append`]). Entries from a clock ahead of this one (another instance's)
//! count until they leave, like any other.

use super::quota::{Hits, Outcome, Quota, State, clamp_u32};

/// One admitted request in a sliding log: when (ticks) and how many hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Logged {
    /// When it was admitted, in ticks (see the module docs of `algorithm`).
    pub at: u64,
    /// Its hits (a request's `hits_addend`, or a budget's charge).
    pub hits: u32,
}

/// The entries of `log` still inside the period at `now` (ticks).
fn live(log: &[Logged], now: u64, period: u64) -> &[Logged] {
    let first = log.partition_point(|e| !inside(e, now, period));
    &log[first..]
}

/// Whether `e` is inside the period at `now`: it leaves at `at + period`.
fn inside(e: &Logged, now: u64, period: u64) -> bool {
    e.at.saturating_add(period) > now
}

/// Times are in ticks (see the module docs).
pub(super) fn decide(log: &[Logged], quota: &Quota, now: u64, hits: Hits) -> Outcome {
    let period = quota.period;
    let live = live(log, now, period);
    let used: u64 = live.iter().map(|e| u64::from(e.hits)).sum();
    let limit = u64::from(quota.limit);
    let remaining = |used: u64| clamp_u32(limit.saturating_sub(used));
    if hits.cost > limit {
        // Never admitted; a period is the honest wait for anything to change.
        return refused(remaining(used), period);
    }
    if used + hits.cost > limit {
        // The first moment enough of the oldest hits have left.
        let excess = used + hits.cost - limit;
        let mut freed = 0;
        for e in live {
            freed += u64::from(e.hits);
            if freed >= excess {
                return refused(remaining(used), (e.at + period).saturating_sub(now));
            }
        }
        return refused(remaining(used), period);
    }
    // A budget's charge may pass the limit (by at most the limit).
    let used = used + hits.charge;
    // Until the oldest counted hit leaves (a period from now when this
    // request is the oldest).
    let mut oldest = live.first().map_or(now, |e| e.at);
    if hits.charge > 0 {
        oldest = oldest.min(now);
    }
    let newest = live.last().map_or(now, |e| e.at.max(now));
    Outcome {
        allowed: true,
        remaining: remaining(used),
        wait: (oldest + period).saturating_sub(now),
        commit: (hits.charge > 0).then(|| {
            let append = State {
                at: now,
                current: clamp_u32(hits.charge),
                previous: 0,
            };
            (append, newest + period)
        }),
    }
}

fn refused(remaining: u32, wait: u64) -> Outcome {
    Outcome {
        allowed: false,
        remaining,
        wait,
        commit: None,
    }
}

/// Applies a committed append (`commit`'s state, in nanoseconds as the
/// stores hold it, see [`super::Algorithm::decide_log`]) to `log`: drops the
/// entries that have left the period and adds the request's hits in time
/// order (to an entry of the same time, if there is one).
pub fn append(log: &mut Vec<Logged>, append: State, period: u64) {
    log.retain(|e| inside(e, append.at, period.max(1)));
    let at = log.partition_point(|e| e.at <= append.at);
    match at.checked_sub(1).map(|i| &mut log[i]) {
        Some(last) if last.at == append.at => last.hits = last.hits.saturating_add(append.current),
        _ => log.insert(
            at,
            Logged {
                at: append.at,
                hits: append.current,
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Algorithm, NANOS_PER_TICK, Quota};
    use super::*;
    use crate::clock::{NANOS_PER_SEC, Nanos};
    use proptest::prelude::*;

    const MINUTE: Nanos = 60 * NANOS_PER_SEC;

    /// A store of one key: decides `hits` at `now` and commits as a store
    /// would. Whether it was admitted.
    fn ask(log: &mut Vec<Logged>, q: &Quota, now: Nanos, hits: u64) -> Outcome {
        let out = Algorithm::decide_log(log, q, now, hits);
        if let Some((added, _)) = out.commit {
            append(log, added, q.period_ticks());
        }
        out
    }

    fn secs(s: f64) -> Nanos {
        (s * NANOS_PER_SEC as f64) as Nanos
    }

    #[test]
    fn the_boundary_attack_gets_nothing_more_and_a_hit_leaves_exactly_a_period_later() {
        let q = Quota::new(100, MINUTE, 100);
        let mut log = Vec::new();
        let before = (0..100)
            .filter(|_| ask(&mut log, &q, secs(59.5), 1).allowed)
            .count();
        let after = (0..100)
            .filter(|_| ask(&mut log, &q, secs(60.5), 1).allowed)
            .count();
        assert_eq!((before, after), (100, 0), "exact: no boundary to cross");
        assert_eq!(log.len(), 1, "one entry for the requests of one instant");
        let refused = ask(&mut log, &q, secs(119.0), 1);
        assert!(!refused.allowed);
        assert_eq!(refused.wait, secs(0.5), "until the oldest hit leaves");
        assert!(!ask(&mut log, &q, secs(119.5) - NANOS_PER_TICK, 1).allowed);
        assert!(
            ask(&mut log, &q, secs(119.5), 1).allowed,
            "a period later, to the tick"
        );
    }

    #[test]
    fn a_refusal_waits_for_as_many_hits_as_it_needs_to_leave() {
        let q = Quota::new(5, MINUTE, 5);
        let mut log = Vec::new();
        for t in 0..5 {
            assert!(ask(&mut log, &q, secs(f64::from(t)), 1).allowed);
        }
        // Three hits need the three oldest gone: the third leaves at 62 s.
        let out = ask(&mut log, &q, secs(10.0), 3);
        assert_eq!(
            (out.allowed, out.remaining, out.wait),
            (false, 0, secs(52.0))
        );
        assert_eq!(log.len(), 5, "a refusal writes nothing");
        // More than the limit never fits.
        let out = ask(&mut log, &q, secs(10.0), 6);
        assert_eq!((out.allowed, out.wait), (false, MINUTE));
        let out = ask(&mut log, &q, secs(62.0), 3);
        assert_eq!((out.allowed, out.remaining), (true, 0));
        // Admitted: the reset is when the oldest counted hit (3 s) leaves.
        assert_eq!(out.wait, secs(1.0));
    }

    #[test]
    fn a_budget_is_charged_in_full_and_a_check_spends_nothing() {
        let q = Quota {
            budget: true,
            ..Quota::new(10, MINUTE, 10)
        };
        let mut log = Vec::new();
        assert!(ask(&mut log, &q, secs(1.0), 8).allowed);
        assert!(
            ask(&mut log, &q, secs(2.0), 8).allowed,
            "anything left admits"
        );
        let out = ask(&mut log, &q, secs(3.0), 0);
        assert_eq!((out.allowed, out.remaining), (false, 0), "overdrawn by 6");
        assert!(ask(&mut log, &q, secs(61.5), 0).allowed, "the first 8 left");
        assert_eq!(
            log.iter().map(|e| e.hits).sum::<u32>(),
            16,
            "a check adds nothing"
        );
    }

    #[test]
    fn hostile_numbers_and_a_clock_that_goes_back() {
        let q = Quota::new(3, MINUTE, 3);
        let mut log = Vec::new();
        assert!(!ask(&mut log, &q, secs(1.0), u64::MAX).allowed);
        assert!(ask(&mut log, &q, secs(10.0), 1).allowed);
        // Another instance's clock 5 s behind: its hit goes in time order.
        assert!(ask(&mut log, &q, secs(5.0), 1).allowed);
        assert_eq!(
            log.iter().map(|e| e.at).collect::<Vec<_>>(),
            [5_000_000, 10_000_000]
        );
        assert!(ask(&mut log, &q, secs(5.0), 1).allowed);
        assert!(!ask(&mut log, &q, secs(5.0), 1).allowed);
        // The two at 5 s left at 65 s; the one at 10 s counts until 70 s.
        assert!(ask(&mut log, &q, secs(65.5), 2).allowed);
        assert!(!ask(&mut log, &q, secs(69.9), 1).allowed);
        assert!(ask(&mut log, &q, secs(70.0), 1).allowed);
        assert_eq!(Quota::new(0, MINUTE, 1).limit, 0);
        assert!(!ask(&mut Vec::new(), &Quota::new(0, MINUTE, 1), 0, 1).allowed);
    }

    proptest! {
        /// Never more than the limit in any span of one period, whatever
        /// the arrivals; and every refusal's wait is when it would pass.
        #[test]
        fn never_more_than_the_limit_in_any_period(
            limit in 1u32..20,
            gaps in proptest::collection::vec((0u64..3_000, 1u64..4), 1..200),
        ) {
            let q = Quota::new(limit, 10 * NANOS_PER_SEC, limit);
            let mut log = Vec::new();
            let mut admitted: Vec<(Nanos, u64)> = Vec::new();
            let mut now = 0;
            for (gap_ms, hits) in gaps {
                now += gap_ms * 1_000_000;
                let out = ask(&mut log, &q, now, hits);
                if out.allowed {
                    admitted.push((now, hits));
                    let span: u64 = admitted
                        .iter()
                        .filter(|(t, _)| *t + 10 * NANOS_PER_SEC > now)
                        .map(|(_, h)| h)
                        .sum();
                    prop_assert!(span <= u64::from(limit), "{span} in a period at {now}");
                } else if hits <= u64::from(limit) {
                    let later = Algorithm::decide_log(&log, &q, now + out.wait, hits);
                    prop_assert!(later.allowed, "admitted after its wait");
                    if out.wait > NANOS_PER_TICK {
                        let sooner = Algorithm::decide_log(&log, &q, now + out.wait - NANOS_PER_TICK, hits);
                        prop_assert!(!sooner.allowed, "not a tick sooner");
                    }
                }
                prop_assert!(log.len() <= limit as usize);
            }
        }
    }
}
