//! The memory store's state as plain values: what a data directory
//! (`store::durable`) copies out of the shards to write, and hands back to
//! restore. A table entry keeps only its key's hashes, so a copy is only
//! meaningful to a store built with the same hash seed
//! ([`super::MemoryStore::seed`]).

use crate::algorithm::{Held, Logged, State};

/// A counter of the table, by its key's hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    /// The key's 64-bit hash (the table key).
    pub hash: u64,
    /// The key's independent 32-bit check value.
    pub check: u32,
    /// Whole seconds since the epoch after which the state no longer matters.
    pub expires: u32,
    /// Whose counter (see [`crate::store::scope_tag`]).
    pub scope: u64,
    /// The algorithm's state.
    pub state: State,
}

/// A counter kept by its key's bytes (its hash collided with another's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed {
    /// The counter key's canonical bytes.
    pub key: Box<[u8]>,
    /// As [`Counter::expires`].
    pub expires: u32,
    /// As [`Counter::scope`].
    pub scope: u64,
    /// The algorithm's state.
    pub state: State,
}

/// A sliding log, by its key's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogCopy {
    /// The counter key's canonical bytes.
    pub key: Box<[u8]>,
    /// As [`Counter::expires`].
    pub expires: u32,
    /// As [`Counter::scope`].
    pub scope: u64,
    /// The admitted requests still in the period, oldest first.
    pub log: Vec<Logged>,
}

/// A key's held request IDs, by its key's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldCopy {
    /// The key's canonical bytes.
    pub key: Box<[u8]>,
    /// As [`Counter::expires`].
    pub expires: u32,
    /// As [`Counter::scope`].
    pub scope: u64,
    /// The IDs held, each with its amount and when it lapses.
    pub held: Vec<Held>,
}

/// What one shard holds (or what to put back into a store).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardCopy {
    /// The table's counters.
    pub counters: Vec<Counter>,
    /// The overflow map's counters (normally none).
    pub overflow: Vec<Keyed>,
    /// The sliding logs.
    pub logs: Vec<LogCopy>,
    /// The lists of held request IDs.
    pub held: Vec<HeldCopy>,
}

impl ShardCopy {
    /// Empties the copy, keeping its allocations.
    pub fn clear(&mut self) {
        self.counters.clear();
        self.overflow.clear();
        self.logs.clear();
        self.held.clear();
    }

    /// The keys held.
    pub fn len(&self) -> usize {
        self.counters.len() + self.overflow.len() + self.logs.len() + self.held.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
