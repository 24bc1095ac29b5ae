//! The per-second pool (the reference's `REDIS_PERSECOND`): limits whose
//! period is one second live on a Redis of their own, so their churn stays
//! off the Redis that holds the longer limits.
//!
//! A request whose checks all sit on one side is decided there. A request
//! with checks on both is decided on both at once, each side all or nothing;
//! when the request is refused, a side that admitted gets its hits back
//! (the refund script Cluster uses across slots), so a refused request
//! spends nothing, as everywhere. If a refund fails, the hits stay spent
//! (the error is on the side of refusing, never of admitting more). A
//! quota-mode rule is decided per side: with quota checks on both sides a
//! request can be refused where one Redis would have admitted it, never
//! admitted where it would have refused.

use futures_util::future::join;
use smallvec::SmallVec;

use super::pool::Pool;
use crate::clock::{NANOS_PER_SEC, Nanos};
use crate::store::{Check, StoreError, refused};

/// Whether a check belongs to the per-second pool: a period of one second.
pub(super) fn is_per_second(check: &Check) -> bool {
    check.quota.period == NANOS_PER_SEC && check.quota.calendar.is_none() && check.hold.is_none()
}

/// Decides `checks` across `main` and `per_second` (some checks belong to
/// the pool, see [`is_per_second`]), all or nothing.
pub(super) async fn decide_split(
    main: &Pool,
    per_second: &Pool,
    checks: &mut [Check],
    now: Nanos,
) -> Result<(), StoreError> {
    let (seconds, others): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) =
        (0..checks.len()).partition(|&i| is_per_second(&checks[i]));
    if others.is_empty() {
        return per_second.decide(checks, now).await;
    }
    let mut fast: SmallVec<[Check; 4]> = seconds.iter().map(|&i| checks[i].clone()).collect();
    let mut slow: SmallVec<[Check; 4]> = others.iter().map(|&i| checks[i].clone()).collect();
    let (fast_result, slow_result) = join(
        per_second.decide(&mut fast, now),
        main.decide(&mut slow, now),
    )
    .await;
    let admitted_fast = fast_result.is_ok() && !refused(fast.iter());
    let admitted_slow = slow_result.is_ok() && !refused(slow.iter());
    if let Err(e) = fast_result.as_ref().and(slow_result.as_ref()) {
        // Not decided: the failure modes answer, and whatever a side
        // admitted goes back.
        let e = e.clone();
        if admitted_fast {
            per_second.give_back(&fast, now).await;
        }
        if admitted_slow {
            main.give_back(&slow, now).await;
        }
        return Err(e);
    }
    for (check, &i) in fast.iter().zip(&seconds) {
        checks[i].outcome = check.outcome;
    }
    for (check, &i) in slow.iter().zip(&others) {
        checks[i].outcome = check.outcome;
    }
    if refused(checks.iter()) {
        if admitted_fast {
            per_second.give_back(&fast, now).await;
        }
        if admitted_slow {
            main.give_back(&slow, now).await;
        }
    }
    Ok(())
}
