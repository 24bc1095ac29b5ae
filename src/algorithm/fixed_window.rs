//! Fixed window: one counter per window (multiples of the period since the
//! epoch, or calendar windows).

use super::quota::{Hits, Outcome, Quota, State, clamp_u32};
use crate::calendar::Window;

/// Times are in ticks (see the module docs).
pub(super) fn decide(state: State, quota: &Quota, window: Window, now: u64, hits: Hits) -> Outcome {
    let window_end = window.end;
    let used = if state.at == window.index {
        u64::from(state.current)
    } else {
        0
    };
    let limit = u64::from(quota.limit);
    // `cost > limit` first: a cost no window can hold is refused before any
    // sum is formed (a client sends `hits` up to u64::MAX).
    if hits.cost > limit || used + hits.cost > limit {
        // Denied: the earliest admission is the next window (for a cost above
        // the limit, never; the window end is still the honest reset time).
        return Outcome {
            allowed: false,
            remaining: clamp_u32(limit.saturating_sub(used)),
            wait: window_end - now,
            commit: None,
        };
    }
    // A budget's charge may pass the limit (by at most the limit).
    let used = used + hits.charge;
    Outcome {
        allowed: true,
        remaining: clamp_u32(limit.saturating_sub(used)),
        wait: window_end - now,
        commit: (hits.charge > 0).then(|| {
            let next = State {
                at: window.index,
                current: clamp_u32(used),
                previous: 0,
            };
            (next, window_end)
        }),
    }
}
