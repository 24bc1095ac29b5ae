//! Where counters live. A store decides a request's checks together: either
//! every admitted check is committed, or (when any enforced check is denied)
//! none is. Being denied is a value; `Err` means the store could not decide.

mod batch;
pub(crate) mod durable;
mod error;
mod key;
pub mod memory;
pub mod redis;
mod status;

pub use batch::{
    Check, Commits, HeldCommits, HoldCheck, ScopeTag, Stored, decide_batch, refused, scope_tag,
};
pub use error::{ResetError, StoreError};
pub use key::{CounterKey, KeyParts};
pub use memory::{MemoryStore, MemoryStoreOptions};
pub use redis::{QuotaExchange, QuotaTotals};
pub use status::StoreStatus;

use crate::clock::Nanos;

/// What an operator's reset deletes.
pub enum ResetScope<'a> {
    /// The counters of these checks (one client's).
    Keys(&'a [Check]),
    /// Every counter of a domain, or of one rule in it.
    Bulk {
        /// The domain.
        domain: &'a str,
        /// The scope as tags, for a store that keeps them.
        tag: ScopeTag,
        /// For a store that keeps key names: which counters, by their
        /// descriptor's entries (`None`: the whole domain).
        wanted: Option<redis::Wanted<'a>>,
        /// More counters than this: nothing is deleted (a store that
        /// deletes in one cheap pass may ignore it).
        max_keys: usize,
    },
}

/// A handle on the instances' shared views of who is limited (see
/// [`Store::views`]).
pub use redis::ViewShare;

/// A handle on a store that instances share, for the quota service's
/// exchange (see [`Store::quota_share`]).
pub use redis::QuotaShare;

/// A handle on a shared store's reset epoch, for an instance to learn of
/// the resets other instances make (see [`Store::reset_watcher`]).
pub use redis::ResetWatch as ResetWatcher;

/// The configured store.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "one store per process, made once and never moved on the hot path"
)]
pub enum Store {
    /// The embedded, in-process store.
    Memory(MemoryStore),
    /// Redis or Redis Cluster.
    Redis(redis::RedisStore),
}

impl Store {
    /// Decides `checks` at `now`, all or nothing; fills each check's outcome.
    pub async fn decide(&self, checks: &mut [Check], now: Nanos) -> Result<(), StoreError> {
        match self {
            Store::Memory(store) => store.decide(checks, now),
            Store::Redis(store) => store.decide(checks, now).await,
        }
    }

    /// Whether [`Store::decide_now`] answers (the store never waits).
    pub fn answers_at_once(&self) -> bool {
        matches!(self, Store::Memory(_))
    }

    /// Decides without waiting, when the store can; `None` otherwise.
    pub fn decide_now(&self, checks: &mut [Check], now: Nanos) -> Option<Result<(), StoreError>> {
        match self {
            Store::Memory(store) => Some(store.decide(checks, now)),
            Store::Redis(_) => None,
        }
    }

    /// Where the quota service's instances exchange weights and usage:
    /// `None` for a store no other instance shares.
    pub fn quota_share(&self) -> Option<QuotaShare> {
        match self {
            Store::Memory(_) => None,
            Store::Redis(store) => Some(store.quotas()),
        }
    }

    /// The embedded store with `options`.
    pub fn memory(options: MemoryStoreOptions) -> Self {
        Store::Memory(MemoryStore::new(options))
    }

    /// Where the instances share their views of who is limited: `None` for
    /// a store no other instance shares.
    pub fn views(&self) -> Option<ViewShare> {
        match self {
            Store::Memory(_) => None,
            Store::Redis(store) => Some(store.views()),
        }
    }

    /// The store's health, as a handle: whether it answers, its circuits,
    /// its events and its data directory.
    pub fn status(&self) -> StoreStatus {
        match self {
            Store::Memory(store) => StoreStatus::memory(store.persistence().cloned()),
            Store::Redis(store) => StoreStatus::redis(store.status()),
        }
    }

    /// The embedded store, for tests that look inside it.
    pub fn as_memory(&self) -> Option<&MemoryStore> {
        match self {
            Store::Memory(store) => Some(store),
            Store::Redis(_) => None,
        }
    }

    /// Where this instance learns of other instances' resets: `None` for a
    /// store no other instance shares.
    pub fn reset_watcher(&self) -> Option<ResetWatcher> {
        match self {
            Store::Memory(_) => None,
            Store::Redis(store) => Some(store.watch()),
        }
    }

    /// What this instance owes a shared store (releases it could not take
    /// while the store was down): `None` for a store that cannot be down.
    pub fn owed_releases(&self) -> Option<redis::OwedReleases> {
        match self {
            Store::Memory(_) => None,
            Store::Redis(store) => Some(store.owed()),
        }
    }

    /// Deletes the counters `scope` names at `now` (an operator's reset:
    /// the next request starts each afresh), with everything the store
    /// remembers of them (a shared store's per-second pool, over-limit
    /// cache and leases, on every instance); returns how many existed.
    pub async fn reset(&self, scope: ResetScope<'_>, now: Nanos) -> Result<usize, ResetError> {
        match (self, scope) {
            (Store::Memory(store), ResetScope::Keys(checks)) => {
                let removed = store.remove(checks.iter().map(|c| &c.key));
                store.persisted().await;
                Ok(removed)
            }
            (Store::Memory(store), ResetScope::Bulk { tag, .. }) => {
                let removed = store.remove_scope(tag);
                store.persisted().await;
                Ok(removed)
            }
            (Store::Redis(store), ResetScope::Keys(checks)) => {
                store.reset(checks, now).await.map_err(ResetError::Store)
            }
            (
                Store::Redis(store),
                ResetScope::Bulk {
                    domain,
                    wanted,
                    max_keys,
                    ..
                },
            ) => store.reset_bulk(domain, wanted, max_keys).await,
        }
    }

    /// Drops state that can no longer affect a decision.
    pub fn sweep(&self, now: Nanos) -> usize {
        match self {
            Store::Memory(store) => store.sweep(now),
            // Redis expires its own keys.
            Store::Redis(_) => 0,
        }
    }
}
