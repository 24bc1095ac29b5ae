//! Exact decisions across hash slots: a request's checks grouped by slot
//! (one group on a standalone Redis), each group one script call through
//! the batcher (or key by key on a slot being migrated), all or nothing
//! across the groups: what a refused request committed in other slots is
//! given back.

use std::sync::Arc;
use std::time::Duration;

use super::keys::{self, KeyNames, Slot, check_code, script_code};
use futures_util::future::join_all;
use smallvec::SmallVec;

use super::coalesce::Batcher;
use super::events::Events;
use super::migration::Migrating;
use super::options::RedisOptions;
use super::part::{Group, Part, Rows, ScriptCheck};
use super::receipt::Calls;
use super::refund::Refunds;
use super::route::Route;
use crate::algorithm::{Algorithm, NANOS_PER_TICK, Outcome};
use crate::calendar::Window;
use crate::clock::Nanos;
use crate::store::{Check, HoldCheck, StoreError, refused};

/// A request's groups, one per hash slot it touches.
pub(super) type Groups = SmallVec<[(Slot, Group); 2]>;

/// All-or-nothing decisions over a [`Batcher`].
pub(super) struct Exact {
    batcher: Batcher,
    refunds: Refunds,
    migrating: Migrating,
    prefix: String,
    clustered: bool,
    timeout: Duration,
}

impl Exact {
    pub(super) fn new(route: &Route, options: &RedisOptions, events: Arc<Events>) -> Self {
        let refunds = Refunds::new(route.clone(), options);
        Self {
            batcher: Batcher::new(Calls::new(route.clone(), options, events), options),
            migrating: Migrating::new(route.clone(), refunds.clone(), options),
            refunds,
            prefix: options.prefix.clone(),
            clustered: route.clustered(),
            timeout: options.timeout,
        }
    }

    /// Decides `checks` at `now` by `deadline`, each slot's group in one
    /// call (all or nothing within it); returns the groups. A refusal
    /// across groups is made whole by [`Exact::keep_all_or_nothing`].
    pub(super) async fn decide(
        &self,
        checks: &mut [Check],
        now: Nanos,
        deadline: tokio::time::Instant,
    ) -> Result<Groups, StoreError> {
        let cluster = self.clustered;
        let mut groups: SmallVec<[(Slot, Group); 2]> = SmallVec::new();
        let mut names_of: SmallVec<[SmallVec<[String; 4]>; 2]> = SmallVec::new();
        for (i, check) in checks.iter().enumerate() {
            let window = check.quota.window_at(now);
            let names = KeyNames::of_check(&self.prefix, check, now);
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
        if let Err(refund) = self.refunds.groups(ro, committed, now).await {
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
    async fn decide_group(
        &self,
        slot: Slot,
        group: &Group,
        checks: &[Check],
        now: Nanos,
        spend: bool,
        deadline: tokio::time::Instant,
    ) -> Result<Rows, StoreError> {
        let part = self.part(group, checks, now, spend);
        match self.batcher.decide_part(slot, part, deadline).await {
            Err(StoreError::Migrating) => {
                // Boxed: rare, and every request's future would carry it.
                let part = self.part(group, checks, now, spend);
                Box::pin(self.migrating.decide(slot, &part, deadline)).await
            }
            rows => rows,
        }
    }

    /// One slot's checks of a request, as the batch script takes them;
    /// `spend: false` asks each check with zero hits (what is left,
    /// spending nothing).
    fn part(&self, group: &Group, checks: &[Check], now: Nanos, spend: bool) -> Part {
        let args = group.checks.iter().zip(&group.windows).map(|(&i, window)| {
            let c = &checks[i];
            let enforce = match (c.enforced, c.quota_mode) {
                (false, _) => b'0',
                (true, false) => b'1',
                (true, true) if group.quota_here => b'q',
                (true, true) => b'Q',
            };
            if let Some(hold) = &c.hold {
                return held_check(c, hold, window, spend, enforce);
            }
            let (start_or_period, end_or_burst) = match c.algorithm {
                Algorithm::TokenBucket => (
                    (c.quota.period / NANOS_PER_TICK).max(1),
                    u64::from(c.quota.burst.max(1)),
                ),
                Algorithm::SlidingLog => (c.quota.period_ticks(), 0),
                _ => (window.start, window.end),
            };
            let hits = c.quota.hits(if spend { c.hits } else { 0 });
            ScriptCheck {
                code: script_code(c.algorithm).as_bytes()[0],
                limit: c.quota.limit,
                start_or_period,
                end_or_burst,
                cost: hits.cost,
                charge: hits.charge,
                enforce,
                id: None,
            }
        });
        Part {
            keys: group.keys.clone(),
            now_us: now / NANOS_PER_TICK,
            checks: args.collect(),
        }
    }

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
        let committed = groups.iter().filter(|(_, g)| !g.refused_here(ro));
        if let Err(error) = self.refunds.groups(ro, committed, now).await {
            tracing::warn!(%error, "refund across Cluster slots failed; the refused request's hits stay spent");
            return;
        }
        // As on one slot (and in memory), the admitted checks of a refused
        // request report what is left without it: read once more, spending
        // nothing, now that the refund is in.
        let deadline = tokio::time::Instant::now() + self.timeout;
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

    /// Takes back the hits the admitted `checks` spent at `now` (one request
    /// on this Redis, refused as a whole on another: the per-second pool).
    pub(super) async fn give_back(&self, checks: &[Check], now: Nanos) {
        if let Err(error) = self.refunds.checks(checks, now).await {
            tracing::warn!(%error, "refund across the per-second Redis pool failed; the refused request's hits stay spent");
        }
    }
}

/// A held-ID call's script arguments (see `held.lua`). Asked without
/// spending (`spend: false`, a Cluster's second read), every such call is a
/// release or a settlement of nothing for an ID no call can hold (the empty
/// one): what is left, changing nothing.
fn held_check(
    c: &Check,
    hold: &HoldCheck,
    window: &Window,
    spend: bool,
    enforce: u8,
) -> ScriptCheck {
    let code = check_code(c);
    let (code, id, charge) = match (spend, code) {
        (true, b'i') => (code, &*hold.id, 1),
        (true, b'r') => (code, &*hold.id, c.charge()),
        (true, b'e') => (code, &*hold.id, c.quota.hits(c.hits).charge),
        (true, _) => (code, &*hold.id, 0),
        (false, b'i' | b'o') => (b'o', &[][..], 0),
        (false, _) => (b'e', &[][..], 0),
    };
    let in_flight = matches!(code, b'i' | b'o');
    ScriptCheck {
        code,
        limit: c.quota.limit,
        start_or_period: if in_flight { c.quota.period_ticks() } else { 0 },
        end_or_burst: if in_flight { 0 } else { window.end },
        // A budget's bound on reservations rides in the cost's place.
        cost: if in_flight {
            charge.max(1)
        } else {
            u64::from(hold.most)
        },
        charge,
        enforce,
        id: Some(id.into()),
    }
}
