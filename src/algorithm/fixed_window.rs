//! Fixed window: one counter per calendar window (`now / period`).

use super::{Outcome, Quota, State, clamp_u32, cost};

/// Times are in ticks (see the module docs).
pub(super) fn decide(state: State, quota: &Quota, now: u64, hits: u64) -> Outcome {
    let window = now / quota.period;
    let window_end = (window + 1).saturating_mul(quota.period);
    let used = if state.at == window {
        u64::from(state.current)
    } else {
        0
    };
    let limit = u64::from(quota.limit);
    // `cost > limit` first: a cost no window can hold is refused before any
    // sum is formed (a client sends `hits` up to u64::MAX).
    if cost(hits) > limit || used + cost(hits) > limit {
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
