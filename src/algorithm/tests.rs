//! Algorithm behaviour with a manual clock, and property tests over random
//! arrival sequences.

use super::*;
use crate::clock::NANOS_PER_SEC;
use proptest::prelude::*;

const MINUTE: Nanos = 60 * NANOS_PER_SEC;

/// The algorithms whose state is one 16-byte [`State`] (the sliding log's
/// is its log: its own tests are in `sliding_log.rs`).
const COUNTERS: [Algorithm; 3] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::TokenBucket,
];

fn quota(limit: u32, period: Nanos) -> Quota {
    Quota::new(limit, period, limit)
}

/// Runs `n` single hits at `now`, committing as a store would; returns how
/// many were admitted.
fn burst(alg: Algorithm, state: &mut State, q: &Quota, now: Nanos, n: u32) -> u32 {
    let mut admitted = 0;
    for _ in 0..n {
        let out = alg.decide(*state, q, now, 1);
        if out.allowed {
            admitted += 1;
        }
        if let Some((next, _)) = out.commit {
            *state = next;
        }
    }
    admitted
}

fn secs(s: f64) -> Nanos {
    (s * NANOS_PER_SEC as f64) as Nanos
}

#[test]
fn fixed_window_admits_twice_the_limit_across_a_boundary() {
    let q = quota(100, MINUTE);
    let mut st = State::default();
    let before = burst(Algorithm::FixedWindow, &mut st, &q, secs(59.5), 100);
    let after = burst(Algorithm::FixedWindow, &mut st, &q, secs(60.5), 100);
    assert_eq!((before, after), (100, 100));
    // And it still holds the limit inside one window.
    assert_eq!(burst(Algorithm::FixedWindow, &mut st, &q, secs(61.0), 5), 0);
}

#[test]
fn sliding_window_admits_at_most_limit_plus_one_in_the_boundary_attack() {
    let q = quota(100, MINUTE);
    let mut st = State::default();
    let before = burst(Algorithm::SlidingWindow, &mut st, &q, secs(59.5), 100);
    let after = burst(Algorithm::SlidingWindow, &mut st, &q, secs(60.5), 100);
    assert_eq!(before, 100);
    assert_eq!(before + after, 101);
    // Halfway through the next window about half a window is available
    // (the article's example: 49).
    assert_eq!(
        burst(Algorithm::SlidingWindow, &mut st, &q, secs(90.0), 100),
        49
    );
}

#[test]
fn sliding_window_retry_after_is_exact() {
    let q = quota(10, MINUTE);
    let mut st = State::default();
    assert_eq!(
        burst(Algorithm::SlidingWindow, &mut st, &q, secs(30.0), 10),
        10
    );
    let denied = Algorithm::SlidingWindow.decide(st, &q, secs(30.0), 1);
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 0);
    let at = secs(30.0) + denied.wait;
    assert!(Algorithm::SlidingWindow.decide(st, &q, at, 1).allowed);
    assert!(!Algorithm::SlidingWindow.decide(st, &q, at - 1, 1).allowed);
}

#[test]
fn token_bucket_admits_a_full_burst_then_refills_at_the_rate() {
    // 60 per minute (1/s) with a burst of 10.
    let q = Quota::new(60, MINUTE, 10);
    let mut st = State::default();
    assert_eq!(
        burst(Algorithm::TokenBucket, &mut st, &q, secs(0.0), 15),
        10
    );
    let denied = Algorithm::TokenBucket.decide(st, &q, secs(0.0), 1);
    assert!(!denied.allowed);
    assert_eq!(denied.wait, NANOS_PER_SEC, "one token per second");
    assert_eq!(burst(Algorithm::TokenBucket, &mut st, &q, secs(5.0), 7), 5);
    assert_eq!(burst(Algorithm::TokenBucket, &mut st, &q, secs(5.5), 1), 0);
    assert_eq!(burst(Algorithm::TokenBucket, &mut st, &q, secs(6.0), 1), 1);
}

#[test]
fn token_bucket_handles_costs_above_one() {
    let q = Quota::new(60, MINUTE, 10);
    let st = State::default();
    let eight = Algorithm::TokenBucket.decide(st, &q, 0, 8);
    assert!(eight.allowed);
    assert_eq!(eight.remaining, 2);
    let st = eight.commit.expect("admitted hits are committed").0;
    let three = Algorithm::TokenBucket.decide(st, &q, 0, 3);
    assert!(!three.allowed);
    assert_eq!(three.wait, NANOS_PER_SEC, "one more token is needed");
    assert!(Algorithm::TokenBucket.decide(st, &q, secs(1.0), 3).allowed);
    // A cost above the burst can never be admitted, even on a full bucket.
    assert!(
        !Algorithm::TokenBucket
            .decide(State::default(), &q, 0, 11)
            .allowed
    );
}

#[test]
fn a_check_with_zero_hits_counts_nothing() {
    for alg in COUNTERS {
        let q = quota(2, MINUTE);
        let mut st = State::default();
        let check = alg.decide(st, &q, 0, 0);
        assert!(check.allowed, "{alg}");
        assert_eq!(check.commit, None, "{alg}");
        assert_eq!(burst(alg, &mut st, &q, 0, 2), 2, "{alg}");
        assert!(!alg.decide(st, &q, 0, 0).allowed, "{alg}: exhausted");
    }
}

#[test]
fn state_expires_when_it_stops_mattering() {
    let q = quota(5, MINUTE);
    for alg in COUNTERS {
        let out = alg.decide(State::default(), &q, secs(10.0), 1);
        let (state, expires) = out.commit.expect("committed");
        // At the expiry time, a fresh state decides exactly like the stored one.
        for probe in [expires, expires + 1, expires + MINUTE] {
            assert_eq!(
                alg.decide(state, &q, probe, 1),
                alg.decide(State::default(), &q, probe, 1),
                "{alg} at {probe}"
            );
        }
    }
}

#[test]
fn zero_limit_refuses_everything() {
    for alg in COUNTERS {
        let q = quota(0, MINUTE);
        assert!(!alg.decide(State::default(), &q, 0, 1).allowed, "{alg}");
    }
}

/// Replays arrivals (gap in ms, cost) and returns the admitted (time, cost) pairs.
fn replay(alg: Algorithm, q: &Quota, arrivals: &[(u64, u64)]) -> Vec<(Nanos, u64)> {
    let mut st = State::default();
    let mut now = 0;
    let mut admitted = Vec::new();
    for &(gap_ms, hits) in arrivals {
        now += gap_ms * 1_000_000;
        let out = alg.decide(st, q, now, hits);
        if out.allowed {
            admitted.push((now, hits));
        }
        if let Some((next, _)) = out.commit {
            assert!(out.allowed, "a denial never commits");
            st = next;
        }
    }
    admitted
}

fn arrivals() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..400, 0u64..4), 1..400)
}

proptest! {
    #[test]
    fn fixed_window_never_exceeds_the_limit_in_a_window(
        limit in 0u32..20, arrivals in arrivals()
    ) {
        let q = quota(limit, NANOS_PER_SEC);
        let mut per_window = std::collections::HashMap::new();
        for (t, hits) in replay(Algorithm::FixedWindow, &q, &arrivals) {
            *per_window.entry(t / q.period).or_insert(0u64) += hits;
        }
        for (window, total) in per_window {
            prop_assert!(total <= u64::from(limit), "window {window}: {total}");
        }
    }

    #[test]
    fn sliding_window_keeps_its_estimate_under_limit_plus_one(
        limit in 0u32..20, arrivals in arrivals()
    ) {
        let q = quota(limit, NANOS_PER_SEC);
        let admitted = replay(Algorithm::SlidingWindow, &q, &arrivals);
        let p = u128::from(q.period);
        for &(t, _) in &admitted {
            let window = t / q.period;
            let offset = u128::from(t % q.period);
            let count = |w: u64| -> u128 {
                admitted.iter().filter(|(at, _)| *at / q.period == w && *at <= t)
                    .map(|(_, h)| u128::from(*h)).sum()
            };
            let previous = if window == 0 { 0 } else { count(window - 1) };
            // estimate after each admission, recomputed from the log
            let scaled = previous * (p - offset) + count(window) * p;
            prop_assert!(scaled < (u128::from(limit) + 1) * p, "at {t}");
            prop_assert!(count(window) <= u128::from(limit));
        }
    }

    #[test]
    fn token_bucket_never_exceeds_burst_plus_refill(
        limit in 1u32..20, burst in 1u32..20, arrivals in arrivals()
    ) {
        let q = Quota::new(limit, NANOS_PER_SEC, burst);
        let interval = q.period / u64::from(limit);
        let admitted = replay(Algorithm::TokenBucket, &q, &arrivals);
        for (i, &(t1, _)) in admitted.iter().enumerate() {
            let mut total = 0u64;
            for &(t2, hits) in &admitted[i..] {
                total += hits;
                // GCRA conformance: cost over [t1, t2] <= burst + (t2 - t1) / interval
                prop_assert!(
                    total * interval <= u64::from(burst) * interval + (t2 - t1),
                    "{total} hits in [{t1}, {t2}]"
                );
            }
        }
    }

    #[test]
    fn denied_wait_is_when_the_request_would_be_admitted(
        limit in 1u32..20, arrivals in arrivals(), alg in 0usize..3
    ) {
        let alg = COUNTERS[alg];
        let q = quota(limit, NANOS_PER_SEC);
        let mut st = State::default();
        let mut now = 0;
        for (gap_ms, hits) in arrivals {
            now += gap_ms * 1_000_000;
            let out = alg.decide(st, &q, now, hits);
            if !out.allowed && hits.max(1) <= u64::from(limit) {
                prop_assert!(alg.decide(st, &q, now + out.wait, hits).allowed);
            }
            if let Some((next, _)) = out.commit { st = next; }
        }
    }
}

/// Every unit's period, in nanoseconds.
fn any_period() -> impl Strategy<Value = Nanos> {
    prop::sample::select(crate::period::Unit::ALL.to_vec()).prop_map(|u| u.nanos())
}

/// Hits as a client may send them: small, near the limits, or anything.
fn any_hits() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..5,
        Just(u64::from(u32::MAX)),
        Just(u64::from(u32::MAX) + 1),
        Just(1u64 << 53),
        Just(u64::MAX),
        any::<u64>(),
    ]
}

proptest! {
    /// Over the whole range of limits, bursts, units, hits and time jumps:
    /// nothing panics, a denial commits nothing, an admission never exceeds
    /// what the limit could ever admit, what is left never exceeds the
    /// limit, and a window's counter never goes down.
    #[test]
    fn every_input_keeps_the_invariants(
        limit in any::<u32>(),
        burst in 1u32..=u32::MAX,
        period in any_period(),
        multiplier in prop_oneof![Just(1u64), 2u64..=100],
        budget in any::<bool>(),
        alg in 0usize..3,
        steps in prop::collection::vec((0u64..(400 * 86_400 * NANOS_PER_SEC), any_hits()), 1..40),
    ) {
        let alg = COUNTERS[alg];
        // Any multiple of a unit up to the longest period rules allow.
        let period = (period * multiplier).min(crate::period::MAX_PERIOD_SECONDS * NANOS_PER_SEC);
        let q = Quota { budget, ..Quota::new(limit, period, burst) };
        let mut st = State::default();
        let mut now = 1_700_000_000 * NANOS_PER_SEC;
        for (gap, hits) in steps {
            now += gap;
            let out = alg.decide(st, &q, now, hits);
            let most = match alg {
                Algorithm::TokenBucket => u64::from(burst),
                _ => u64::from(limit),
            };
            if out.allowed && limit > 0 {
                // A budget admits any charge while something is left, and
                // charges at most the whole limit.
                let charged = q.hits(hits).charge;
                prop_assert!(charged <= u64::from(limit.max(burst)), "{alg}: {charged} charged");
                prop_assert!(budget || hits <= most, "{alg}: {hits} admitted against {most}");
            }
            if limit == 0 {
                prop_assert!(!out.allowed, "{alg}: a limit of zero admits nothing");
            }
            prop_assert!(u64::from(out.remaining) <= most.max(u64::from(limit)));
            match out.commit {
                Some((next, expires)) => {
                    prop_assert!(out.allowed && hits > 0, "only admitted hits commit");
                    prop_assert!(expires >= now, "an expiry in the past");
                    if alg != Algorithm::TokenBucket && next.at == st.at {
                        prop_assert!(next.current >= st.current, "{alg}: the counter went down");
                    }
                    st = next;
                }
                None => prop_assert!(!out.allowed || hits == 0),
            }
        }
    }
}

#[test]
fn a_budget_admits_while_anything_is_left_and_charges_in_full() {
    for alg in COUNTERS {
        let q = Quota {
            budget: true,
            ..quota(10, MINUTE)
        };
        let mut st = State::default();
        let now = 1_700_000_000 * NANOS_PER_SEC;
        let mut step = |hits: u64| {
            let out = alg.decide(st, &q, now, hits);
            if let Some((next, _)) = out.commit {
                st = next;
            }
            out
        };
        assert_eq!(step(0).remaining, 10, "{alg}: a check spends nothing");
        let seven = step(7);
        assert!(seven.allowed && seven.remaining == 3, "{alg}: {seven:?}");
        let over = step(u64::MAX);
        assert!(over.allowed, "{alg}: charged although more than is left");
        assert_eq!(over.remaining, 0, "{alg}");
        assert!(!step(0).allowed, "{alg}: spent, the next check is refused");
        assert!(!step(1).allowed, "{alg}: and so is a charge");
    }
    // The overdraft is bounded by the whole limit: 7 + 10, not 7 + 2^64.
    let q = Quota {
        budget: true,
        ..quota(10, MINUTE)
    };
    let out = Algorithm::FixedWindow.decide(State::default(), &q, 0, 7);
    let (st, _) = out.commit.expect("committed");
    let out = Algorithm::FixedWindow.decide(st, &q, 0, u64::MAX);
    assert_eq!(out.commit.expect("committed").0.current, 17);
}

#[test]
fn a_multiple_of_a_unit_is_one_window() {
    // 3 per 5 minutes: windows at multiples of 300 s since the epoch.
    let q = quota(3, 5 * MINUTE);
    let mut st = State::default();
    let start = 1_800_000_000 * NANOS_PER_SEC; // a multiple of 300 s
    assert_eq!(
        burst(Algorithm::FixedWindow, &mut st, &q, start + secs(299.0), 5),
        3
    );
    let out = Algorithm::FixedWindow.decide(st, &q, start + secs(299.0), 1);
    assert_eq!(out.wait, NANOS_PER_SEC);
    assert_eq!(
        burst(Algorithm::FixedWindow, &mut st, &q, start + secs(300.0), 5),
        3
    );
    let window = q.window_at(start + secs(301.0));
    assert_eq!(
        (window.start, window.end),
        (
            (start + 300 * NANOS_PER_SEC) / 1_000,
            (start + 600 * NANOS_PER_SEC) / 1_000
        )
    );
}

#[test]
fn a_token_bucket_beyond_a_century_is_refused_and_clamped() {
    let q = Quota::new(1, 365 * 86_400 * NANOS_PER_SEC, 1000);
    assert_eq!(bucket_span(&q), None, "1,000 years to refill");
    // Decided anyway (a limit sent in a request), it stays a bucket: the
    // span is clamped, so it empties and refuses instead of wrapping.
    let mut st = State::default();
    let now = 1_700_000_000 * NANOS_PER_SEC;
    assert_eq!(burst(Algorithm::TokenBucket, &mut st, &q, now, 200), 100);
    assert!(!Algorithm::TokenBucket.decide(st, &q, now, 1).allowed);
}
