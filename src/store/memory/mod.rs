//! The embedded store: sharded hash tables of 40-byte entries.
//!
//! Keys are not stored. Each entry holds a 64-bit hash of the counter's
//! canonical key (the table key) and an independent 32-bit check value from
//! the same 128-bit hash. A lookup whose hash matches but whose check does not
//! is a collision: that key lives in a small per-shard overflow map keyed by
//! its full bytes, so a collision never merges two counters. With 1,000,000
//! keys a 64-bit collision is expected about once in 30 million runs; the
//! overflow map is normally empty. Beside its state, an entry keeps whose
//! counter it is (the domain's and the rule's hashes, 8 bytes), so an
//! operator's reset of a rule or a domain deletes its counters
//! ([`MemoryStore::remove_scope`]).
//!
//! State is dropped once it can no longer affect a decision (the algorithm
//! says when): lazily when a full shard needs room, and by [`MemoryStore::sweep`],
//! which the server runs every second. Memory is therefore bounded by the keys
//! active in the last window, and by `max_keys` in any case.

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use super::{Check, CounterKey, HeldCommits, ScopeTag, StoreError, Stored, decide_batch};
use crate::algorithm::{Algorithm, Held, Logged, State};
use crate::clock::{NANOS_PER_SEC, Nanos};

mod persistence;
mod shard;
mod snapshot;

pub use persistence::{DataEvents, Persistence};
use shard::{Place, Shard};
pub use snapshot::{Counter, HeldCopy, Keyed, LogCopy, ShardCopy};

/// How the memory store is sized.
#[derive(Debug, Clone, Copy)]
pub struct MemoryStoreOptions {
    /// The most keys held at once. When a shard is full and none of its keys
    /// has expired, new keys are refused with [`StoreError::Full`] (existing
    /// keys keep working), and the limiter applies the rule's failure mode.
    pub max_keys: usize,
    /// Number of shards (rounded up to a power of two).
    pub shards: usize,
}

impl Default for MemoryStoreOptions {
    fn default() -> Self {
        Self {
            max_keys: 20_000_000,
            shards: 256,
        }
    }
}

/// Hashes canonical key bytes to 128 bits with a per-process seed.
pub type KeyHasher = fn(seed: u64, bytes: &[u8]) -> u128;

fn xxh3(seed: u64, bytes: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128_with_seed(bytes, seed)
}

/// The embedded store.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    max_per_shard: usize,
    max_keys: usize,
    seed: u64,
    hasher: KeyHasher,
    /// The data directory's writer, when the counters are kept on disk.
    persistence: Option<Arc<Persistence>>,
}

impl MemoryStore {
    /// A store with a random hash seed.
    pub fn new(options: MemoryStoreOptions) -> Self {
        // A per-process seed keeps keys' placement unpredictable to clients.
        let seed =
            std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u64);
        Self::with_hasher(options, seed, xxh3)
    }

    /// A store with a given hash function (tests force collisions with it).
    pub fn with_hasher(options: MemoryStoreOptions, seed: u64, hasher: KeyHasher) -> Self {
        let shards = options.shards.max(1).next_power_of_two();
        Self {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            max_per_shard: options.max_keys.div_ceil(shards).max(1),
            max_keys: options.max_keys,
            seed,
            hasher,
            persistence: None,
        }
    }

    fn locate(&self, key: &CounterKey) -> (usize, u64, u32) {
        let h = (self.hasher)(self.seed, key.as_bytes());
        let hash = (h >> 64) as u64;
        // The table uses the hash's low bits for buckets and its top bits for
        // tags; the shard comes from bits neither depends on much.
        let shard = ((hash >> 32) as usize) & (self.shards.len() - 1);
        (shard, hash, h as u32)
    }

    /// Decides `checks` at `now`, all or nothing.
    pub fn decide(&self, checks: &mut [Check], now: Nanos) -> Result<(), StoreError> {
        let located: SmallVec<[(usize, u64, u32); 4]> =
            checks.iter().map(|c| self.locate(&c.key)).collect();
        // Lock every shard involved, in index order so requests cannot deadlock.
        let mut order: SmallVec<[usize; 4]> = located.iter().map(|l| l.0).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Shard>); 4]> =
            order.iter().map(|&i| (i, self.shards[i].lock())).collect();
        let shard_of = |i: usize| order.binary_search(&i).unwrap_or(0);

        let mut places: SmallVec<[Place; 4]> = SmallVec::new();
        let mut states: SmallVec<[State; 4]> = SmallVec::new();
        // Logs and held IDs are gathered only for a request that has them
        // (an empty list reads as nothing stored for every check).
        let mut logs: SmallVec<[&[Logged]; 4]> = SmallVec::new();
        let mut held: SmallVec<[&[Held]; 4]> = SmallVec::new();
        let any_log = checks.iter().any(|c| c.algorithm == Algorithm::SlidingLog);
        let any_hold = checks.iter().any(|c| c.hold.is_some());
        for (check, &(shard, hash, tag)) in checks.iter().zip(&located) {
            let guard = &guards[shard_of(shard)].1;
            if any_hold {
                held.push(match check.hold {
                    Some(_) => guard
                        .held
                        .get(check.key.as_bytes())
                        .map_or(&[], |h| &h.held),
                    None => &[],
                });
            }
            if check.algorithm == Algorithm::SlidingLog {
                places.push(Place::Log);
                states.push(State::default());
                logs.push(guard.logs.get(check.key.as_bytes()).map_or(&[], |l| &l.log));
                continue;
            }
            let (place, state) = guard.find(&check.key, hash, tag);
            places.push(place);
            states.push(state);
            if any_log {
                logs.push(&[]);
            }
        }
        let stored = Stored {
            states: &states,
            logs: &logs,
            held: &held,
        };
        let (commits, held_commits) = decide_batch(checks, stored, now);
        drop((logs, held));
        let now_secs = (now / NANOS_PER_SEC) as u32;
        // Room for every new key is made (or found missing) before anything
        // is written: a request the store cannot hold whole spends nothing.
        let new_keys = |shard: usize, guard: &Shard| {
            let mut hashes: SmallVec<[u64; 4]> = SmallVec::new();
            let mut logs: SmallVec<[&[u8]; 1]> = SmallVec::new();
            for (((commit, place), located), check) in
                commits.iter().zip(&places).zip(&located).zip(checks.iter())
            {
                match (commit, place, located.0 == shard) {
                    (Some(_), Place::Table(hash, _), true)
                        if !hashes.contains(hash)
                            && guard.table.find(*hash, |e| e.hash == *hash).is_none() =>
                    {
                        hashes.push(*hash);
                    }
                    (Some(_), Place::Log, true)
                        if !logs.contains(&check.key.as_bytes())
                            && !guard.logs.contains_key(check.key.as_bytes()) =>
                    {
                        logs.push(check.key.as_bytes());
                    }
                    _ => {}
                }
            }
            let lists = held_commits
                .iter()
                .zip(checks.iter().zip(&located))
                .filter(|(c, (check, l))| {
                    c.is_some() && l.0 == shard && !guard.held.contains_key(check.key.as_bytes())
                })
                .count();
            hashes.len() + logs.len() + lists
        };
        for (shard, guard) in guards.iter_mut() {
            // Cheap bound first: the hot path never counts.
            if guard.len() + checks.len() > self.max_per_shard
                && guard.len() + new_keys(*shard, guard) > self.max_per_shard
            {
                guard.sweep(now_secs);
                if guard.len() + new_keys(*shard, guard) > self.max_per_shard {
                    return Err(StoreError::Full {
                        max_keys: self.max_keys,
                    });
                }
            }
        }
        write_held(&mut guards, &shard_of, checks, &located, held_commits);
        for ((commit, place), (check, &(shard, _, _))) in commits
            .into_iter()
            .zip(&places)
            .zip(checks.iter().zip(&located))
        {
            let Some((state, expires)) = commit else {
                continue;
            };
            let expires = u32::try_from(expires.div_ceil(NANOS_PER_SEC)).unwrap_or(u32::MAX);
            let guard = &mut guards[shard_of(shard)].1;
            guard.write(place, check, state, expires);
        }
        Ok(())
    }

    /// Deletes the counters of `keys` (an operator's reset); returns how
    /// many existed. Each key's shard is locked while it goes.
    pub fn remove<'a>(&self, keys: impl IntoIterator<Item = &'a CounterKey>) -> usize {
        let mut removed = 0;
        for key in keys {
            let (shard, hash, tag) = self.locate(key);
            let mut shard = self.shards[shard].lock();
            let lists = usize::from(shard.held.remove(key.as_bytes()).is_some());
            if shard.overflow.remove(key.as_bytes()).is_some()
                || shard.logs.remove(key.as_bytes()).is_some()
            {
                removed += 1;
                continue;
            }
            if let Ok(entry) = shard
                .table
                .find_entry(hash, |e| e.hash == hash && e.check == tag)
            {
                entry.remove();
                removed += 1;
            } else {
                removed += lists;
            }
        }
        removed
    }

    /// Deletes every counter in `scope` (an operator's reset of a rule or a
    /// domain); returns how many there were. One shard is locked at a time,
    /// each for a walk of its own entries only, so decisions wait for at
    /// most one shard's walk.
    pub fn remove_scope(&self, scope: ScopeTag) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            let mut shard = shard.lock();
            let before = shard.len();
            shard.table.retain(|e| !scope.holds(e.scope));
            shard.overflow.retain(|_, s| !scope.holds(s.scope));
            shard.logs.retain(|_, s| !scope.holds(s.scope));
            shard.held.retain(|_, s| !scope.holds(s.scope));
            removed += before - shard.len();
        }
        removed
    }

    /// Drops every entry whose state no longer matters at `now`. Returns how
    /// many were dropped.
    pub fn sweep(&self, now: Nanos) -> usize {
        let now_secs = (now / NANOS_PER_SEC) as u32;
        self.shards.iter().map(|s| s.lock().sweep(now_secs)).sum()
    }

    /// The number of keys held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// For a data directory (`store::durable`): the state copied out and put
/// back, by the keys' hashes, with the seed that made them.
impl MemoryStore {
    /// A store whose counters a data directory keeps: `seed` is the one
    /// its saved counters were hashed with.
    pub fn durable(options: MemoryStoreOptions, seed: u64, persistence: Arc<Persistence>) -> Self {
        let mut store = Self::with_hasher(options, seed, xxh3);
        store.persistence = Some(persistence);
        store
    }

    /// The hash seed of the keys.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The number of shards ([`MemoryStore::copy_shard`] takes each).
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The data directory's writer, if the counters are kept on disk.
    pub fn persistence(&self) -> Option<&Arc<Persistence>> {
        self.persistence.as_ref()
    }

    /// Waits until what was deleted before this call is deleted on disk
    /// too (an operator's reset), when the counters are kept on disk.
    pub async fn persisted(&self) {
        if let Some(p) = &self.persistence
            && !p.flushed().await
        {
            tracing::warn!(
                "a reset is done in memory but not yet in the data directory (see the log and /healthcheck)"
            );
        }
    }

    /// Copies shard `index`'s state that still matters at `now_secs` into
    /// `out` (emptied first). The shard is locked for the copy only.
    pub fn copy_shard(&self, index: usize, now_secs: u32, out: &mut ShardCopy) {
        out.clear();
        if let Some(shard) = self.shards.get(index) {
            shard.lock().copy_into(now_secs, out);
        }
    }

    /// Puts saved state back, each key into its shard (a key held already
    /// takes the saved state). Returns how many keys were put.
    pub fn restore(&self, copy: ShardCopy) -> usize {
        let mask = self.shards.len() - 1;
        let put = copy.len();
        for c in copy.counters {
            self.shards[((c.hash >> 32) as usize) & mask]
                .lock()
                .restore_counter(c);
        }
        let shard_of = |key: &[u8]| (((self.hasher)(self.seed, key) >> 96) as usize) & mask;
        let lock = |key: &[u8]| self.shards[shard_of(key)].lock();
        for k in copy.overflow {
            lock(&k.key).restore_keyed(k);
        }
        for l in copy.logs {
            lock(&l.key).restore_log(l);
        }
        for h in copy.held {
            lock(&h.key).restore_held(h);
        }
        put
    }
}

/// Writes the held IDs each check's call left (an empty list deletes the
/// key's); room for new keys was made beforehand.
fn write_held(
    guards: &mut [(usize, MutexGuard<'_, Shard>)],
    shard_of: &dyn Fn(usize) -> usize,
    checks: &[Check],
    located: &[(usize, u64, u32)],
    commits: HeldCommits,
) {
    for ((commit, check), &(shard, _, _)) in commits.into_iter().zip(checks).zip(located) {
        let Some((held, lapses)) = commit else {
            continue;
        };
        let expires = u32::try_from(lapses.div_ceil(NANOS_PER_SEC)).unwrap_or(u32::MAX);
        guards[shard_of(shard)].1.write_held(check, held, expires);
    }
}

#[cfg(test)]
mod tests;
