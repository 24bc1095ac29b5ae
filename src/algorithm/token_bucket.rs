//! Token bucket as GCRA: one timestamp per key, the theoretical arrival time
//! (`tat`) of the next request. Each hit moves `tat` forward by one emission
//! interval (`period / limit`); a request is admitted while `tat` stays within
//! `burst` intervals of now. An empty bucket refills at `limit` per period.

use super::{Outcome, Quota, State, clamp_u32, cost};
use crate::clock::Nanos;

pub(super) fn decide(state: State, quota: &Quota, now: Nanos, hits: u64) -> Outcome {
    if quota.limit == 0 {
        return Outcome {
            allowed: false,
            remaining: 0,
            wait: quota.period,
            commit: None,
        };
    }
    let interval = (quota.period / u64::from(quota.limit)).max(1);
    let tolerance = interval.saturating_mul(u64::from(quota.burst));
    let tat = state.at.max(now);
    let tokens_left = |tat: Nanos| clamp_u32(tolerance.saturating_sub(tat - now) / interval);

    let needed = tat.saturating_add(interval.saturating_mul(cost(hits)));
    if needed - now > tolerance {
        // When the cost is above the burst it can never be admitted; the
        // honest figure is then the time until the bucket is full.
        let wait = if cost(hits) > u64::from(quota.burst) {
            tat - now
        } else {
            needed - now - tolerance
        };
        return Outcome {
            allowed: false,
            remaining: tokens_left(tat),
            wait,
            commit: None,
        };
    }
    let tat = tat + interval * hits;
    Outcome {
        allowed: true,
        remaining: tokens_left(tat),
        // Time until the bucket is full again.
        wait: tat - now,
        commit: (hits > 0).then_some((
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
