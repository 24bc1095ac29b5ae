//! Keys known to be over their limit, answered without a Redis round trip
//! until the time Redis said a request would next be admitted. Under attack
//! this keeps the flood of refused calls off Redis.
//!
//! Only single-hit denials are remembered: their wait is exactly when one hit
//! becomes possible, and traffic from other instances can only push that
//! later, so the cache never admits what Redis would refuse.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::algorithm::Outcome;
use crate::clock::Nanos;
use crate::store::Check;

const SHARDS: usize = 16;
/// Entries per shard before expired ones are dropped (and, if still full,
/// new ones are not remembered).
const SHARD_CAP: usize = 65_536;

/// The over-limit cache.
#[derive(Debug, Default)]
pub struct OverLimitCache {
    shards: [Mutex<HashMap<u64, Nanos>>; SHARDS],
}

fn id(check: &Check) -> u64 {
    // The limit and the capacity are part of the identity: an override with
    // another limit is another question, and a priority lane decides one
    // counter against less of them (its refusal is not the whole limit's).
    let quota = u64::from(check.quota.limit) | u64::from(check.quota.burst) << 32;
    xxhash_rust::xxh3::xxh3_64_with_seed(check.key.as_bytes(), quota)
}

impl OverLimitCache {
    fn shard(&self, id: u64) -> &Mutex<HashMap<u64, Nanos>> {
        &self.shards[(id as usize) % SHARDS]
    }

    /// When an enforced check is known to be over its limit, fills every
    /// outcome (that one denied, the others admitted but not counted, their
    /// remaining unknown and reported as the full limit) and returns true.
    pub fn answer(&self, checks: &mut [Check], now: Nanos) -> bool {
        // A call that holds, frees or settles a request ID goes to the
        // store: a release frees a slot the cache would go on refusing.
        if checks.iter().any(|c| c.hold.is_some()) {
            return false;
        }
        let blocked = checks.iter().enumerate().find_map(|(i, c)| {
            // A quota-mode refusal alone refuses nothing.
            if !c.enforced || c.quota_mode {
                return None;
            }
            let id = id(c);
            let mut shard = self.shard(id).lock();
            let until = *shard.get(&id)?;
            if until <= now {
                // Expired: gone, so the key is asked of the store again.
                shard.remove(&id);
                return None;
            }
            Some((i, until - now))
        });
        let Some((denied, wait)) = blocked else {
            return false;
        };
        for (i, check) in checks.iter_mut().enumerate() {
            check.outcome = Some(Outcome {
                allowed: i != denied,
                remaining: if i == denied { 0 } else { check.quota.limit },
                wait: if i == denied { wait } else { 0 },
                commit: None,
            });
        }
        true
    }

    /// Forgets every key (counters were reset in bulk).
    pub fn clear(&self) {
        for shard in &self.shards {
            shard.lock().clear();
        }
    }

    /// Remembers the enforced single-hit denials among decided `checks`.
    pub fn remember(&self, checks: &[Check], now: Nanos) {
        for check in checks
            .iter()
            // A budget may be refunded (a settlement), a held ID released:
            // their refusals may end before their wait does.
            .filter(|c| c.enforced && !c.quota_mode && c.hits <= 1)
            .filter(|c| !c.quota.budget && c.hold.is_none())
        {
            let Some(outcome) = check.outcome.filter(|o| !o.allowed) else {
                continue;
            };
            let id = id(check);
            let mut shard = self.shard(id).lock();
            if shard.len() >= SHARD_CAP {
                shard.retain(|_, until| *until > now);
                if shard.len() >= SHARD_CAP {
                    continue;
                }
            }
            shard.insert(id, now + outcome.wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{Algorithm, Quota};
    use crate::clock::NANOS_PER_SEC;
    use crate::rules::Unit;
    use crate::store::CounterKey;

    fn refused(wait: Nanos) -> Check {
        let mut key = CounterKey::new("d", Algorithm::FixedWindow, Unit::Second);
        key.entry("user", "u");
        let mut check = Check::new(
            key,
            Algorithm::FixedWindow,
            Quota::new(1, NANOS_PER_SEC, 1),
            1,
            true,
        );
        check.outcome = Some(Outcome {
            allowed: false,
            remaining: 0,
            wait,
            commit: None,
        });
        check
    }

    /// A refusal is answered until it expires; then the key is asked of
    /// the store again (the entry is dropped), never answered with a wait
    /// gone negative.
    #[test]
    fn a_refusal_answers_until_it_expires_and_then_goes() {
        let cache = OverLimitCache::default();
        cache.remember(&[refused(3 * NANOS_PER_SEC)], 10 * NANOS_PER_SEC);
        let mut checks = [refused(0)];
        assert!(cache.answer(&mut checks, 12 * NANOS_PER_SEC));
        assert_eq!(checks[0].outcome.map(|o| o.wait), Some(NANOS_PER_SEC));
        assert!(!cache.answer(&mut checks, 13 * NANOS_PER_SEC), "expired");
        assert!(!cache.answer(&mut checks, 14 * NANOS_PER_SEC));
        assert!(cache.shards.iter().all(|s| s.lock().is_empty()), "dropped");
    }
}
