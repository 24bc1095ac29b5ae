//! All or nothing across Cluster hash slots: the hits a refused request
//! committed in other slots are given back.

use super::keys::Slot;
use futures_util::future::join_all;

use super::RedisStore;
use super::keys::{KeyNames, script_code};
use super::script::Invocation;
use super::slots::Group;
use crate::algorithm::NANOS_PER_TICK;
use crate::clock::Nanos;
use crate::store::{Check, StoreError, refused};

impl RedisStore {
    /// Across hash slots each script call is all or nothing on its own; when
    /// one slot refused the request, the hits the others committed are given
    /// back, so the request as a whole spends nothing. The refusal stands
    /// whatever happens here; a refund that fails leaves those hits spent, so
    /// the error is only ever on the side of refusing, and it is logged.
    pub(super) async fn keep_all_or_nothing(
        &self,
        checks: &mut [Check],
        groups: &[(Slot, Group)],
        now: Nanos,
    ) {
        let ro: &[Check] = checks;
        // A group refused on its own (and wrote nothing) only when the whole
        // request is refused (see `Group::quota_here`), so nothing needs
        // undoing unless the request is refused.
        if !refused(ro.iter()) {
            return;
        }
        let timeout = self.inner.options.timeout;
        let committed = groups.iter().filter(|(_, g)| !g.refused_here(ro));
        if let Err(error) = self.refund_groups(ro, committed).await {
            tracing::warn!(%error, "refund across Cluster slots failed; the refused request's hits stay spent");
            return;
        }
        // As on one slot (and in memory), the admitted checks of a refused
        // request report what is left without it: read once more, spending
        // nothing, now that the refund is in.
        let deadline = tokio::time::Instant::now() + timeout;
        let rereads =
            groups
                .iter()
                .filter(|(_, g)| !g.refused_here(ro))
                .map(|(slot, group)| async move {
                    let rows = self
                        .decide_group(*slot, group, ro, now, false, deadline)
                        .await?;
                    Ok::<_, StoreError>((group, rows))
                });
        let Ok(rereads) = tokio::time::timeout_at(deadline, join_all(rereads)).await else {
            return;
        };
        for (group, rows) in rereads.into_iter().flatten() {
            for (&i, (_, left, _)) in group.checks.iter().zip(rows) {
                if let Some(outcome) = checks[i].outcome.as_mut().filter(|o| o.allowed) {
                    outcome.remaining = left;
                }
            }
        }
    }

    /// Gives back what the admitted checks of `groups` committed (each
    /// group one script call of its slot), within the store's timeout.
    pub(super) async fn refund_groups<'g>(
        &self,
        checks: &[Check],
        groups: impl Iterator<Item = &'g (Slot, Group)>,
    ) -> Result<(), StoreError> {
        let refunds = groups.map(|(slot, group)| {
            let mut inv = self.inner.scripts.refund.prepare_invoke();
            let mut k = 0;
            for &i in &group.checks {
                let c = &checks[i];
                // The counter the hits went to: the first of the check's keys.
                inv.key(&group.keys[k]);
                k += KeyNames::count(c.algorithm);
                let committed = if c.outcome.is_some_and(|o| o.allowed) {
                    c.charge()
                } else {
                    0
                };
                refund_args(&mut inv, c, committed);
            }
            async move { self.invoke(*slot, &inv).await }
        });
        let timeout = self.inner.options.timeout;
        match tokio::time::timeout(timeout, join_all(refunds)).await {
            Err(_) => Err(StoreError::Timeout(timeout)),
            Ok(results) => results
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), Err),
        }
    }
}

/// One check's arguments for `refund.lua`: its algorithm, the `hits` to give
/// back, and the interval between a token bucket's tokens (µs).
pub(super) fn refund_args(inv: &mut Invocation<'_>, check: &Check, hits: u64) {
    let period = (check.quota.period / NANOS_PER_TICK).max(1);
    let interval = period / u64::from(check.quota.limit.max(1));
    inv.arg(script_code(check.algorithm))
        .arg(hits)
        .arg(interval.max(1));
}
