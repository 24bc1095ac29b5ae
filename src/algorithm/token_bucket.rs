//! Token bucket as GCRA: one timestamp per key, the theoretical arrival time
//! (`tat`) of the next request. Each hit moves `tat` forward by one emission
//! interval (`period / limit`); a request is admitted while `tat` stays within
//! `burst` intervals of now. An empty bucket refills at `limit` per period.

use super::quota::{Hits, MAX_BUCKET_SPAN, Outcome, Quota, State, clamp_u32};

/// Times are in ticks (see the module docs).
pub(super) fn decide(state: State, quota: &Quota, now: u64, hits: Hits) -> Outcome {
    if quota.limit == 0 {
        return Outcome {
            allowed: false,
            remaining: 0,
            wait: quota.period,
            commit: None,
        };
    }
    let interval = (quota.period / u64::from(quota.limit)).max(1);
    // Rules beyond the span are refused at load; the clamp keeps any other
    // input (an override, a fuzzer) from overflowing.
    let tolerance = interval
        .saturating_mul(u64::from(quota.burst))
        .min(MAX_BUCKET_SPAN);
    let burst = tolerance / interval;
    let tat = state.at.max(now);
    // Past the tolerance (a rule whose burst shrank on reload) nothing is left.
    let tokens_left = |tat: u64| clamp_u32(tolerance.saturating_sub(tat - now) / interval);

    let c = hits.cost;
    // A cost above the burst can never be admitted; the honest figure is then
    // the time until the bucket is full. Checked first, so `interval * c`
    // below stays within the tolerance.
    if c > burst {
        return Outcome {
            allowed: false,
            remaining: tokens_left(tat),
            wait: tat - now,
            commit: None,
        };
    }
    let needed = tat + interval * c;
    if needed - now > tolerance {
        return Outcome {
            allowed: false,
            remaining: tokens_left(tat),
            wait: needed - now - tolerance,
            commit: None,
        };
    }
    // A budget's charge may overdraw the bucket (by at most the burst).
    let tat = tat + interval * hits.charge;
    Outcome {
        allowed: true,
        remaining: tokens_left(tat),
        // Time until the bucket is full again.
        wait: tat - now,
        commit: (hits.charge > 0).then_some((
            State {
                at: tat,
                current: 0,
                previous: 0,
            },
            // Once now reaches tat the bucket is full: the state is the same as none.
            tat,
        )),
    }
}
