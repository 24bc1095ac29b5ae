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

use super::RedisStore;
use super::keys::KeyNames;
use super::refund::refund_args;
use crate::clock::{NANOS_PER_SEC, Nanos};
use crate::store::{Check, StoreError, refused};

/// Whether a check belongs to the per-second pool: a period of one second.
pub(super) fn is_per_second(check: &Check) -> bool {
    check.quota.period == NANOS_PER_SEC && check.quota.calendar.is_none()
}

impl RedisStore {
    /// Decides `checks`, some of which belong to `per_second`.
    pub(super) async fn decide_split(
        &self,
        per_second: &RedisStore,
        checks: &mut [Check],
        now: Nanos,
    ) -> Result<(), StoreError> {
        let (seconds, others): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) =
            (0..checks.len()).partition(|&i| is_per_second(&checks[i]));
        if others.is_empty() {
            return per_second.decide_here(checks, now).await;
        }
        let mut fast: SmallVec<[Check; 4]> = seconds.iter().map(|&i| checks[i].clone()).collect();
        let mut slow: SmallVec<[Check; 4]> = others.iter().map(|&i| checks[i].clone()).collect();
        let (fast_result, slow_result) = join(
            per_second.decide_here(&mut fast, now),
            self.decide_here(&mut slow, now),
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
                self.give_back(&slow, now).await;
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
                self.give_back(&slow, now).await;
            }
        }
        Ok(())
    }

    /// Takes back the hits the admitted `checks` spent (one request on one
    /// Redis, refused as a whole elsewhere), within the store's timeout: one
    /// refund call per check, whose keys share a slot on a Cluster too.
    async fn give_back(&self, checks: &[Check], now: Nanos) {
        let refunds = checks
            .iter()
            .filter(|c| c.outcome.is_some_and(|o| o.allowed) && c.charge() > 0)
            .map(|check| {
                let mut invocation = self.inner.scripts.refund.prepare_invoke();
                let window = check.quota.window_at(now);
                // The counter the hits went to (see refund.lua).
                invocation.key(
                    KeyNames::of(&self.inner.options.prefix, &check.key, window.index).first(),
                );
                refund_args(&mut invocation, check, check.charge());
                async move { self.invoke(invocation.slot(), &invocation).await }
            });
        let all = futures_util::future::join_all(refunds);
        let failed = match tokio::time::timeout(self.inner.options.timeout, all).await {
            Err(_) => Some(StoreError::Timeout(self.inner.options.timeout)),
            Ok(results) => results.into_iter().find_map(Result::err),
        };
        if let Some(error) = failed {
            tracing::warn!(%error, "refund across the per-second Redis pool failed; the refused request's hits stay spent");
        }
    }
}
