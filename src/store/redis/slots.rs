//! A request's checks grouped by hash slot (one group on a standalone
//! Redis), each group one script call, and each check's script arguments.

use std::sync::Arc;

use super::keys::{self, KeyNames, Slot, script_code};
use futures_util::future::join_all;
use smallvec::SmallVec;

use super::RedisStore;

use super::options::RedisTarget;
use super::part::{Part, Rows, ScriptCheck};
use crate::algorithm::{Algorithm, NANOS_PER_TICK, Outcome};
use crate::calendar::Window;
use crate::clock::Nanos;
use crate::store::{Check, StoreError, refused};

/// One hash slot's share of a request.
pub(super) struct Group {
    pub(super) checks: SmallVec<[usize; 4]>,
    /// The checks' keys, in order; shared with the script call's [`Part`].
    pub(super) keys: Arc<[String]>,
    /// Each check's window, in ticks (the scripts take the caller's windows).
    pub(super) windows: SmallVec<[Window; 4]>,
    /// Every enforced quota-mode check of the request is in this group, so
    /// the script can apply the quota-mode rule itself.
    pub(super) quota_here: bool,
}

impl Group {
    /// Whether the script refused (and so committed nothing) for this group.
    pub(super) fn refused_here(&self, checks: &[Check]) -> bool {
        let mine = self.checks.iter().map(|&i| &checks[i]);
        if self.quota_here {
            refused(mine)
        } else {
            refused(mine.filter(|c| !c.quota_mode))
        }
    }
}

impl RedisStore {
    pub(super) async fn call(
        &self,
        checks: &mut [Check],
        now: Nanos,
        deadline: tokio::time::Instant,
    ) -> Result<SmallVec<[(Slot, Group); 2]>, StoreError> {
        let cluster = matches!(self.inner.options.target, RedisTarget::Cluster(_));
        let mut groups: SmallVec<[(Slot, Group); 2]> = SmallVec::new();
        let mut names_of: SmallVec<[SmallVec<[String; 4]>; 2]> = SmallVec::new();
        for (i, check) in checks.iter().enumerate() {
            let window = check.quota.window_at(now);
            let names = KeyNames::of(&self.inner.options.prefix, &check.key, window.index);
            let slot = if cluster {
                keys::slot_of(names.first().as_bytes())
            } else {
                0
            };
            let g = match groups.iter().position(|(s, _)| *s == slot) {
                Some(g) => g,
                None => {
                    groups.push((
                        slot,
                        Group {
                            checks: SmallVec::new(),
                            keys: Arc::new([]),
                            windows: SmallVec::new(),
                            quota_here: false,
                        },
                    ));
                    names_of.push(SmallVec::new());
                    groups.len() - 1
                }
            };
            groups[g].1.checks.push(i);
            groups[g].1.windows.push(window);
            names_of[g].extend(names.into_names());
        }
        for ((_, group), names) in groups.iter_mut().zip(names_of) {
            group.keys = names.into_iter().collect();
        }
        let is_quota = |c: &Check| c.enforced && c.quota_mode;
        let quota = checks.iter().filter(|c| is_quota(c)).count();
        for (_, group) in &mut groups {
            // Linear: a group holds them all when it holds as many as there are.
            let here = group
                .checks
                .iter()
                .filter(|&&i| is_quota(&checks[i]))
                .count();
            group.quota_here = here == quota;
        }
        let fill = |checks: &mut [Check], group: &Group, rows: Rows| {
            for (&i, (allowed, remaining, wait_us)) in group.checks.iter().zip(rows) {
                checks[i].outcome = Some(Outcome {
                    allowed,
                    remaining,
                    wait: wait_us.saturating_mul(NANOS_PER_TICK),
                    commit: None,
                });
            }
        };
        if let [(slot, group)] = groups.as_slice() {
            // One slot (always, on a standalone Redis): no futures to gather.
            let rows = self
                .decide_group(*slot, group, checks, now, true, deadline)
                .await?;
            fill(checks, group, rows);
            return Ok(groups);
        }
        let ro: &[Check] = checks;
        let calls = groups
            .iter()
            .map(|(slot, group)| self.decide_group(*slot, group, ro, now, true, deadline));
        let replies = join_all(calls).await;
        let mut failed = None;
        let mut answered = SmallVec::<[bool; 2]>::new();
        for ((_, group), rows) in groups.iter().zip(replies) {
            answered.push(rows.is_ok());
            match rows {
                Ok(rows) => fill(checks, group, rows),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        let Some(error) = failed else {
            return Ok(groups);
        };
        // A slot failed: the request is answered from the failure modes, as
        // if Redis had not been asked. What the other slots committed is
        // given back, so a request not decided by Redis spends nothing.
        let ro: &[Check] = checks;
        let committed = groups
            .iter()
            .zip(&answered)
            .filter(|((_, g), answered)| **answered && !g.refused_here(ro))
            .map(|(g, _)| g);
        if let Err(refund) = self.refund_groups(ro, committed).await {
            tracing::warn!(error = %refund, "refund after a failed Cluster slot failed; the hits its other slots took stay spent");
        }
        for check in checks.iter_mut() {
            check.outcome = None;
        }
        Err(error)
    }

    /// Decides one slot's checks of a request by `deadline` (`spend: false`
    /// spends nothing): with the other requests of the moment in one call
    /// (coalesce.rs), or key by key while the slot is being migrated
    /// (migration.rs).
    pub(super) async fn decide_group(
        &self,
        slot: Slot,
        group: &Group,
        checks: &[Check],
        now: Nanos,
        spend: bool,
        deadline: tokio::time::Instant,
    ) -> Result<Rows, StoreError> {
        let part = self.part(group, checks, now, spend);
        match self.decide_part(slot, part, deadline).await {
            Err(StoreError::Migrating) => {
                // Boxed: rare, and every request's future would carry it.
                let part = self.part(group, checks, now, spend);
                Box::pin(self.decide_migrating(slot, &part, deadline)).await
            }
            rows => rows,
        }
    }

    /// One slot's checks of a request, as the batch script takes them;
    /// `spend: false` asks each check with zero hits (what is left,
    /// spending nothing).
    pub(super) fn part(&self, group: &Group, checks: &[Check], now: Nanos, spend: bool) -> Part {
        let args = group.checks.iter().zip(&group.windows).map(|(&i, window)| {
            let c = &checks[i];
            let (start_or_period, end_or_burst) = match c.algorithm {
                Algorithm::TokenBucket => (
                    (c.quota.period / NANOS_PER_TICK).max(1),
                    u64::from(c.quota.burst.max(1)),
                ),
                _ => (window.start, window.end),
            };
            let hits = c.quota.hits(if spend { c.hits } else { 0 });
            let enforce = match (c.enforced, c.quota_mode) {
                (false, _) => b'0',
                (true, false) => b'1',
                (true, true) if group.quota_here => b'q',
                (true, true) => b'Q',
            };
            ScriptCheck {
                code: script_code(c.algorithm).as_bytes()[0],
                limit: c.quota.limit,
                start_or_period,
                end_or_burst,
                cost: hits.cost,
                charge: hits.charge,
                enforce,
            }
        });
        Part {
            keys: group.keys.clone(),
            now_us: now / NANOS_PER_TICK,
            checks: args.collect(),
        }
    }
}
