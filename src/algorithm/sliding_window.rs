//! Sliding window counter: the estimate is
//! `previous * (time of the previous window still inside the last period) / period + current`,
//! and a request of cost `c` is admitted while `estimate + c - 1 < limit`
//! (for one hit: while the estimate is below the limit). The boundary attack
//! gets `limit + 1` through instead of the fixed window's `2 * limit`.
//!
//! Arithmetic is in integers scaled by the period, so the same inputs give the
//! same answer here and in the Redis script.

use super::{Outcome, Quota, State, clamp_u32, cost};
use crate::clock::Nanos;

pub(super) fn decide(state: State, quota: &Quota, now: Nanos, hits: u64) -> Outcome {
    let period = u128::from(quota.period);
    let window = now / quota.period;
    let offset = u128::from(now % quota.period);
    let window_end = (window + 1) * quota.period;
    let (previous, current) = if state.at == window {
        (u64::from(state.previous), u64::from(state.current))
    } else if state.at + 1 == window {
        (u64::from(state.current), 0)
    } else {
        (0, 0)
    };
    let limit = u128::from(quota.limit);
    let weighted_previous = u128::from(previous) * (period - offset);
    // estimate * period, for a given count in the current window.
    let scaled = |current: u64| weighted_previous + u128::from(current) * period;

    if scaled(current + cost(hits) - 1) >= limit * period {
        return Outcome {
            allowed: false,
            remaining: remaining(scaled(current), limit, period),
            wait: retry_after(previous, current, cost(hits), quota, offset),
            commit: None,
        };
    }
    let current = current + hits;
    Outcome {
        allowed: true,
        remaining: remaining(scaled(current), limit, period),
        wait: window_end - now,
        commit: (hits > 0).then(|| {
            let next = State {
                at: window,
                current: clamp_u32(current),
                previous: clamp_u32(previous),
            };
            // The current window still counts, as "previous", through the next one.
            (next, window_end + quota.period)
        }),
    }
}

/// `limit - ceil(estimate)`, never below zero.
fn remaining(scaled_estimate: u128, limit: u128, period: u128) -> u32 {
    let used = scaled_estimate.div_ceil(period);
    clamp_u32(limit.saturating_sub(used) as u64)
}

/// The shortest wait after which a request of `cost` is admitted, if nothing
/// else arrives: later in this window as the previous window fades, or in the
/// next one, where this window's count becomes the previous.
fn retry_after(previous: u64, current: u64, cost: u64, quota: &Quota, offset: u128) -> Nanos {
    let period = u128::from(quota.period);
    let limit = u128::from(quota.limit);
    // Admitted at offset `o` when previous * (period - o) < room * period,
    // with room = limit + 1 - current - cost.
    let earliest_offset = |previous: u64, room: u128| -> u128 {
        if previous == 0 {
            0
        } else {
            period.saturating_sub((room * period - 1) / u128::from(previous))
        }
    };
    let room_now = (limit + 1).checked_sub(u128::from(current) + u128::from(cost));
    if let Some(room) = room_now.filter(|r| *r > 0) {
        let at = earliest_offset(previous, room).max(offset);
        if at < period {
            return (at - offset) as Nanos;
        }
    }
    let to_next_window = period - offset;
    match (limit + 1).checked_sub(u128::from(cost)).filter(|r| *r > 0) {
        Some(room) => (to_next_window + earliest_offset(current, room)) as Nanos,
        // A cost above the limit is never admitted; report the window end.
        None => to_next_window as Nanos,
    }
}
