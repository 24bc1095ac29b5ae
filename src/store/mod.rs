//! Where counters live. A store decides a request's checks together: either
//! every admitted check is committed, or (when any enforced check is denied)
//! none is. Being denied is a value; `Err` means the store could not decide.

mod batch;
mod key;
pub mod memory;

pub use batch::{Check, Commits, decide_batch};
pub use key::CounterKey;
pub use memory::{MemoryStore, MemoryStoreOptions};

use crate::clock::Nanos;

/// Why a store could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The memory store is at its key cap and nothing in the shard has expired.
    #[error("memory store is full ({max_keys} keys, see --max-keys)")]
    Full {
        /// The configured cap.
        max_keys: usize,
    },
}

impl StoreError {
    /// Whether retrying later may succeed (what the failure mode acts on).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Full { .. } => true,
        }
    }
}

/// The configured store.
#[derive(Debug)]
pub enum Store {
    /// The embedded, in-process store.
    Memory(MemoryStore),
}

impl Store {
    /// Decides `checks` at `now`, all or nothing; fills each check's outcome.
    pub async fn decide(&self, checks: &mut [Check], now: Nanos) -> Result<(), StoreError> {
        match self {
            Store::Memory(store) => store.decide(checks, now),
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
        }
    }

    /// Drops state that can no longer affect a decision.
    pub fn sweep(&self, now: Nanos) -> usize {
        match self {
            Store::Memory(store) => store.sweep(now),
        }
    }
}
