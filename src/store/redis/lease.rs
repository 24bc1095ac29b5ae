//! Leases for hot keys (`consistency: leased` with `lease: N`): an instance
//! reserves N hits of a key's budget from Redis at a time and spends them
//! locally, so a hot key costs one script call per N hits instead of one per
//! request.
//!
//! The reservation rides along with a request that has to ask Redis anyway:
//! next to the request's own check, the script gets a *grab* of N hits on
//! the same counter, in shadow mode (it never refuses the request). Redis
//! counts the grabbed hits as spent at once, so the limit holds exactly:
//! every hit an instance admits locally was counted in Redis first. Near the
//! limit, when fewer than N are left, the grab is refused and each request
//! asks Redis as usual, so the last hits of a window are not stranded in one
//! instance.
//!
//! What a lease costs instead: hits reserved and never used (an instance
//! holding a lease when its window ends, or one that dies holding one) are
//! lost to everyone until the window ends: at most `instances x (N - 1)`
//! fewer admissions per window, never more. For a token bucket the grabbed
//! tokens leave the bucket when grabbed; a lease is spent within the time
//! its tokens represent (N emission intervals), and a burst may exceed the
//! bucket by at most `instances x N`. A refused request spends nothing,
//! locally or in Redis.
//!
//! `remaining` for a hit served from a lease is what this instance's lease
//! has left; the memory store ignores leases (one instance holds every hit).

use std::collections::HashMap;

use smallvec::SmallVec;

use crate::algorithm::{Algorithm, NANOS_PER_TICK, Outcome};
use crate::clock::Nanos;
use crate::store::{Check, StoreError, refused};

/// Leases kept at most; past it, expired ones are dropped, then new ones are
/// not kept (their hits stay spent in Redis: fewer admissions, never more).
const MAX_LEASES: usize = 100_000;

/// One key's local balance.
struct Lease {
    /// The window it was granted in (windows); leases die with their window.
    window: u64,
    /// When it stops being valid.
    until: Nanos,
    /// Hits left.
    balance: u64,
}

/// This process's leases, by counter key.
#[derive(Default)]
pub(super) struct Leases {
    table: parking_lot::Mutex<HashMap<Box<[u8]>, Lease>>,
    /// Keys with a grab in flight: one at a time per key, so concurrent
    /// requests that find the lease empty do not each reserve N hits (the
    /// bound of `instances x N` unspent hits holds); the others ask Redis
    /// exactly meanwhile.
    refilling: parking_lot::Mutex<hashbrown::HashSet<Box<[u8]>>>,
}

/// The lease window of a check at `now`, and until when a lease granted now
/// stays valid.
fn validity(check: &Check, now: Nanos) -> (u64, Nanos) {
    match check.algorithm {
        Algorithm::TokenBucket => {
            let interval = check.quota.period / u64::from(check.quota.limit.max(1));
            (0, now + interval.saturating_mul(u64::from(check.lease)))
        }
        _ => {
            let window = check.quota.window_at(now);
            (window.index, window.end.saturating_mul(NANOS_PER_TICK))
        }
    }
}

impl Leases {
    /// Serves what it can of `checks` from local balances, taking the hits:
    /// fills those checks' outcomes and returns `(check, hits taken)`.
    fn take(&self, checks: &mut [Check], now: Nanos) -> SmallVec<[(usize, u64); 4]> {
        let mut taken = SmallVec::new();
        let mut table = self.table.lock();
        for (i, check) in checks.iter_mut().enumerate() {
            if check.lease == 0 {
                continue;
            }
            let (window, _) = validity(check, now);
            let Some(lease) = table.get_mut(check.key.as_bytes()) else {
                continue;
            };
            if lease.window != window || lease.until <= now {
                continue;
            }
            let charge = check.charge();
            if lease.balance < charge.max(1) {
                continue;
            }
            lease.balance -= charge;
            taken.push((i, charge));
            check.outcome = Some(Outcome {
                allowed: true,
                remaining: u32::try_from(lease.balance).unwrap_or(u32::MAX),
                wait: lease.until - now,
                commit: None,
            });
        }
        taken
    }

    /// Gives back what `take` took (the request was refused or not decided).
    fn give_back(&self, checks: &[Check], taken: &[(usize, u64)]) {
        let mut table = self.table.lock();
        for &(i, hits) in taken {
            if let Some(lease) = table.get_mut(checks[i].key.as_bytes()) {
                lease.balance += hits;
            }
        }
    }

    /// Drops the leases of `checks`' keys (their counters were reset: a
    /// balance granted before would spend hits Redis no longer counts).
    pub(super) fn forget(&self, checks: &[Check]) {
        let mut table = self.table.lock();
        for check in checks {
            table.remove(check.key.as_bytes());
        }
    }

    /// Drops every lease (counters were reset in bulk).
    pub(super) fn clear(&self) {
        self.table.lock().clear();
    }

    /// Adds a granted lease of `check`.
    fn grant(&self, check: &Check, now: Nanos) {
        let (window, until) = validity(check, now);
        let mut table = self.table.lock();
        if table.len() >= MAX_LEASES {
            table.retain(|_, l| l.until > now);
            if table.len() >= MAX_LEASES {
                return;
            }
        }
        let lease = table.entry(check.key.as_bytes().into()).or_insert(Lease {
            window,
            until,
            balance: 0,
        });
        if lease.window != window || lease.until <= now {
            *lease = Lease {
                window,
                until,
                balance: 0,
            };
        }
        lease.balance += u64::from(check.lease);
    }
}

/// The keys this request refills; released when it is done with them, or
/// dropped (a cancelled request must not block refills for good).
struct Refills<'a> {
    leases: &'a Leases,
    keys: SmallVec<[Box<[u8]>; 2]>,
}

impl Drop for Refills<'_> {
    fn drop(&mut self) {
        let mut refilling = self.leases.refilling.lock();
        for key in &self.keys {
            refilling.remove(key);
        }
    }
}

impl Leases {
    /// Decides a request with leased checks: from local leases where they
    /// suffice, else by `exact` (Redis, all or nothing) with a grab for each
    /// leased check beside the request's own.
    pub(super) async fn decide(
        &self,
        checks: &mut [Check],
        now: Nanos,
        exact: impl AsyncFnOnce(&mut [Check]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let leases = self;
        let taken = leases.take(checks, now);
        if taken.len() == checks.len() {
            return Ok(());
        }
        // The rest goes to Redis, with the grabs after it.
        let mut asked: SmallVec<[Check; 4]> = SmallVec::new();
        let mut origin: SmallVec<[usize; 4]> = SmallVec::new();
        for (i, check) in checks.iter().enumerate() {
            if check.outcome.is_none() {
                asked.push(check.clone());
                origin.push(i);
            }
        }
        let own = asked.len();
        let mut refills = Refills {
            leases,
            keys: SmallVec::new(),
        };
        for i in 0..own {
            let check = &asked[i];
            if check.lease > 0 && check.charge() > 0 {
                if !leases.refilling.lock().insert(check.key.as_bytes().into()) {
                    // Another request is refilling this key: ask exactly.
                    continue;
                }
                refills.keys.push(check.key.as_bytes().into());
                let mut grab = check.clone();
                grab.hits = u64::from(check.lease);
                // A grab never refuses the request, and no quota-mode rule
                // counts it.
                grab.enforced = false;
                grab.quota_mode = false;
                asked.push(grab);
            }
        }
        // Boxed: most leased requests are answered above without waiting,
        // and should not carry (and move) the Redis path's future.
        let decided = Box::pin(exact(&mut asked)).await;
        if let Err(e) = decided {
            leases.give_back(checks, &taken);
            return Err(e);
        }
        for (check, &i) in asked[..own].iter().zip(&origin) {
            checks[i].outcome = check.outcome;
        }
        if refused(checks.iter()) {
            leases.give_back(checks, &taken);
            return Ok(());
        }
        for grab in asked[own..]
            .iter()
            .filter(|g| g.outcome.is_some_and(|o| o.allowed))
        {
            leases.grant(grab, now);
        }
        // `refills` ends here: the next refill of these keys may go.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Quota;
    use crate::clock::NANOS_PER_SEC;
    use crate::period::Unit;
    use crate::store::CounterKey;

    const SEC: Nanos = NANOS_PER_SEC;

    /// A check of `user` on a limit of 100 a minute, leasing 10 at a time.
    fn check(user: &str, algorithm: Algorithm, hits: u64) -> Check {
        let mut key = CounterKey::new("d", algorithm, Unit::Minute);
        key.entry("user", user);
        let mut check = Check::new(key, algorithm, Quota::new(100, 60 * SEC, 100), hits, true);
        check.lease = 10;
        check
    }

    #[test]
    fn a_granted_lease_serves_its_hits_and_no_more() {
        let leases = Leases::default();
        let now = 5 * SEC;
        leases.grant(&check("ann", Algorithm::FixedWindow, 1), now);
        let mut served = 0;
        loop {
            let mut checks = [check("ann", Algorithm::FixedWindow, 1)];
            if leases.take(&mut checks, now).is_empty() {
                assert!(checks[0].outcome.is_none(), "not served: left for Redis");
                break;
            }
            served += 1;
            let outcome = checks[0].outcome.expect("served");
            assert!(outcome.allowed);
            assert_eq!(
                u64::from(outcome.remaining),
                10 - served,
                "this lease's balance"
            );
        }
        assert_eq!(served, 10);
        // Another key has no lease; a check without `lease` never uses one.
        let mut other = [check("bob", Algorithm::FixedWindow, 1)];
        assert!(leases.take(&mut other, now).is_empty());
        leases.grant(&check("cy", Algorithm::FixedWindow, 1), now);
        let mut unleased = [check("cy", Algorithm::FixedWindow, 1)];
        unleased[0].lease = 0;
        assert!(leases.take(&mut unleased, now).is_empty());
    }

    #[test]
    fn a_check_larger_than_the_balance_waits_for_redis_and_gives_back_restore() {
        let leases = Leases::default();
        let now = SEC;
        leases.grant(&check("ann", Algorithm::FixedWindow, 1), now);
        let mut big = [check("ann", Algorithm::FixedWindow, 11)];
        assert!(leases.take(&mut big, now).is_empty(), "11 > 10 left");
        // A request of two checks: one served, then refused elsewhere, so
        // what it took goes back.
        let mut two = [
            check("ann", Algorithm::FixedWindow, 4),
            check("bob", Algorithm::FixedWindow, 1),
        ];
        let taken = leases.take(&mut two, now);
        assert_eq!(taken.as_slice(), &[(0, 4)]);
        leases.give_back(&two, &taken);
        let mut all = [check("ann", Algorithm::FixedWindow, 10)];
        assert_eq!(
            leases.take(&mut all, now).as_slice(),
            &[(0, 10)],
            "all 10 back"
        );
    }

    #[test]
    fn a_lease_dies_with_its_window_or_its_time() {
        let leases = Leases::default();
        leases.grant(&check("ann", Algorithm::FixedWindow, 1), 59 * SEC);
        let mut next_window = [check("ann", Algorithm::FixedWindow, 1)];
        assert!(leases.take(&mut next_window, 61 * SEC).is_empty());
        // A token bucket's lease lasts the time its tokens stand for: 10
        // tokens of 100 a minute, 6 s.
        leases.grant(&check("bob", Algorithm::TokenBucket, 1), 0);
        let mut within = [check("bob", Algorithm::TokenBucket, 1)];
        assert_eq!(leases.take(&mut within, 5 * SEC).len(), 1);
        let mut after = [check("bob", Algorithm::TokenBucket, 1)];
        assert!(leases.take(&mut after, 6 * SEC).is_empty());
        // A reset forgets a key's lease; a bulk one every lease.
        leases.grant(&check("cy", Algorithm::FixedWindow, 1), 0);
        leases.grant(&check("dee", Algorithm::FixedWindow, 1), 0);
        leases.forget(&[check("cy", Algorithm::FixedWindow, 1)]);
        assert!(
            leases
                .take(&mut [check("cy", Algorithm::FixedWindow, 1)], 0)
                .is_empty()
        );
        assert_eq!(
            leases
                .take(&mut [check("dee", Algorithm::FixedWindow, 1)], 0)
                .len(),
            1
        );
        leases.clear();
        assert!(
            leases
                .take(&mut [check("dee", Algorithm::FixedWindow, 1)], 0)
                .is_empty()
        );
    }

    #[test]
    fn at_the_bound_expired_leases_make_room_and_live_ones_are_kept() {
        let leases = Leases::default();
        for i in 0..MAX_LEASES {
            leases.grant(&check(&i.to_string(), Algorithm::FixedWindow, 1), 0);
        }
        // Full of live leases: a new one is not kept.
        leases.grant(&check("new", Algorithm::FixedWindow, 1), 1);
        assert!(
            leases
                .take(&mut [check("new", Algorithm::FixedWindow, 1)], 1)
                .is_empty()
        );
        assert_eq!(leases.table.lock().len(), MAX_LEASES);
        // A minute later they have expired: room again.
        leases.grant(&check("new", Algorithm::FixedWindow, 1), 61 * SEC);
        assert_eq!(
            leases
                .take(&mut [check("new", Algorithm::FixedWindow, 1)], 61 * SEC)
                .len(),
            1
        );
        assert_eq!(leases.table.lock().len(), 1);
    }
}
