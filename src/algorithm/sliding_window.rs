//! Sliding window counter: the previous window counts with the share of it
//! still inside the last period, plus the current window. A request of cost
//! `c` is admitted while `estimate + c - 1 < limit` (for one hit: while the
//! estimate is below the limit). The boundary attack gets `limit + 1`
//! through instead of the fixed window's `2 * limit`.
//!
//! The share is counted in steps: a window of `period` ticks is cut into
//! `n <= 2^19` steps of `step` ticks (the smallest power of ten that keeps
//! `n` in bounds: 10 µs for a second, 1 ms for a minute), and after `e` whole
//! steps the previous window weighs `(n - e) / n`. With counts below 2^32
//! every product below stays under 2^53, so the Redis script, which has only
//! doubles, computes the same integers (see the module docs). For periods of
//! whole seconds a step divides the period exactly.

use super::quota::{Hits, Outcome, Quota, State, clamp_u32};
use crate::calendar::Window;

/// Most steps per window: keeps `count * steps` below 2^53 for 33-bit counts.
const MAX_STEPS: u64 = 1 << 19;

/// `(step, steps)` for a period, in ticks.
fn steps(period: u64) -> (u64, u64) {
    let mut step = 1u64;
    // `period > MAX_STEPS * step` is `period.div_ceil(step) > MAX_STEPS`
    // without a division; it cannot overflow, as the loop stops once
    // `MAX_STEPS * step` passes `period`, which is below 2^64 / 1000.
    while period > MAX_STEPS.saturating_mul(step) {
        step *= 10;
    }
    (step, period.div_ceil(step))
}

/// Times are in ticks (see the module docs).
pub(super) fn decide(state: State, quota: &Quota, window: Window, now: u64, hits: Hits) -> Outcome {
    let period = window.end - window.start;
    let offset = now - window.start;
    let window_end = window.end;
    let window = window.index;
    let (step, n) = steps(period);
    let elapsed = offset / step;
    let (previous, current) = if state.at == window {
        (u64::from(state.previous), u64::from(state.current))
    } else if state.at.checked_add(1) == Some(window) {
        (u64::from(state.current), 0)
    } else {
        (0, 0)
    };
    let limit = u64::from(quota.limit);
    // estimate * n, for a given count in the current window. Counts are
    // below 2^32 and a cost is at most the limit, so with n <= 2^19 every
    // product and sum here stays below 2^53: u64 holds them exactly, and so
    // do the Lua script's doubles.
    let scaled = |current: u64| previous * (n - elapsed) + current * n;
    let remaining = |current: u64| clamp_u32(limit.saturating_sub(scaled(current).div_ceil(n)));

    let c = hits.cost;
    if c > limit || scaled(current + c - 1) >= limit * n {
        return Outcome {
            allowed: false,
            remaining: remaining(current),
            wait: retry_after(previous, current, c, limit, (step, n), period, offset),
            commit: None,
        };
    }
    // A budget's charge may pass the limit (by at most the limit).
    let current = current + hits.charge;
    Outcome {
        allowed: true,
        remaining: remaining(current),
        wait: window_end - now,
        commit: (hits.charge > 0).then(|| {
            let next = State {
                at: window,
                current: clamp_u32(current),
                previous: clamp_u32(previous),
            };
            // The current window still counts, as "previous", through the next one.
            (next, window_end.saturating_add(period))
        }),
    }
}

/// The first step at which `previous * (n - step) < room * n`: the previous
/// window has faded enough to leave `room` (at most `n`: the next window).
fn earliest_step(previous: u64, room: u64, n: u64) -> u64 {
    if previous == 0 {
        return 0;
    }
    n.saturating_sub((room * n - 1) / previous)
}

/// The shortest wait after which a request of `cost` is admitted, if nothing
/// else arrives: later in this window as the previous window fades, or in the
/// next one, where this window's count becomes the previous.
fn retry_after(
    previous: u64,
    current: u64,
    cost: u64,
    limit: u64,
    (step, n): (u64, u64),
    period: u64,
    offset: u64,
) -> u64 {
    let to_next_window = period - offset;
    if cost > limit {
        // Never admitted; report the window end.
        return to_next_window;
    }
    // room = limit + 1 - current - cost, when positive.
    if let Some(room) = (limit + 1).checked_sub(current + cost).filter(|r| *r > 0) {
        let at = earliest_step(previous, room, n) * step;
        if at < period {
            return at.saturating_sub(offset);
        }
    }
    let at = (earliest_step(current, limit + 1 - cost, n) * step).min(period);
    to_next_window + at
}
