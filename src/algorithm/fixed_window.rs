//! Fixed window: one counter per calendar window (`now / period`).

use super::{Outcome, Quota, State, clamp_u32, cost};
use crate::clock::Nanos;

pub(super) fn decide(state: State, quota: &Quota, now: Nanos, hits: u64) -> Outcome {
    let window = now / quota.period;
    let window_end = (window + 1) * quota.period;
    let used = if state.at == window {
        u64::from(state.current)
    } else {
        0
    };
    let limit = u64::from(quota.limit);
    if used + cost(hits) > limit {
        // Denied: the earliest admission is the next window (for a cost above
        // the limit, never; the window end is still the honest reset time).
        return Outcome {
            allowed: false,
            remaining: clamp_u32(limit.saturating_sub(used)),
            wait: window_end - now,
            commit: None,
        };
    }
    let used = used + hits;
    Outcome {
        allowed: true,
        remaining: clamp_u32(limit - used),
        wait: window_end - now,
        commit: (hits > 0).then(|| {
            let next = State {
                at: window,
                current: clamp_u32(used),
                previous: 0,
            };
            (next, window_end)
        }),
    }
}
