//! One shard of the memory store: a table of 40-byte entries by their
//! keys' hashes, and beside it the maps of what a hash cannot hold (keys
//! whose hash collided, sliding logs, held request IDs). The store locks a
//! shard and works through these methods; a data directory copies a shard
//! out and puts it back ([`Shard::copy_into`], the `restore_` methods).

use std::collections::HashMap;

use super::snapshot::{Counter, HeldCopy, Keyed, LogCopy, ShardCopy};
use crate::algorithm::{Held, Logged, State, append};
use crate::store::{Check, CounterKey};

#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub(super) hash: u64,
    pub(super) check: u32,
    /// Whole seconds since the epoch after which the state no longer matters.
    pub(super) expires: u32,
    pub(super) state: State,
    /// Whose counter (see [`crate::store::scope_tag`]), for bulk resets.
    pub(super) scope: u64,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) state: State,
    pub(super) expires: u32,
    pub(super) scope: u64,
}

/// A key's held request IDs (an in-flight cap's, a reserved budget's), and
/// whose they are.
#[derive(Debug)]
pub(super) struct HeldSlot {
    pub(super) held: Vec<Held>,
    pub(super) expires: u32,
    pub(super) scope: u64,
}

/// A sliding log's entries (oldest first), and whose they are.
#[derive(Debug)]
pub(super) struct LogSlot {
    pub(super) log: Vec<Logged>,
    pub(super) expires: u32,
    pub(super) scope: u64,
}

#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) table: hashbrown::HashTable<Entry>,
    /// Keys whose hash collided with another key's (normally empty).
    pub(super) overflow: HashMap<Box<[u8]>, Slot>,
    /// Sliding logs, by their keys' bytes: a log is many entries, not a
    /// 16-byte state, and the algorithm is for small limits.
    pub(super) logs: HashMap<Box<[u8]>, LogSlot>,
    /// Held request IDs, by their keys' bytes (a reserved budget's beside
    /// its counter, under the same key).
    pub(super) held: HashMap<Box<[u8]>, HeldSlot>,
}

/// Where one check's state is, inside a locked shard.
pub(super) enum Place {
    Table(u64, u32),
    Overflow,
    Log,
}

impl Shard {
    /// Keys held: counters, logs and lists of held IDs.
    pub(super) fn len(&self) -> usize {
        self.table.len() + self.overflow.len() + self.logs.len() + self.held.len()
    }

    /// The stored state of `key`, and where to write it back.
    pub(super) fn find(&self, key: &CounterKey, hash: u64, tag: u32) -> (Place, State) {
        // A key lives in the overflow map only after colliding; look there
        // first so it is found even after the entry it collided with has
        // expired.
        if let Some(slot) = (!self.overflow.is_empty())
            .then(|| self.overflow.get(key.as_bytes()))
            .flatten()
        {
            return (Place::Overflow, slot.state);
        }
        match self.table.find(hash, |e| e.hash == hash) {
            Some(e) if e.check == tag => (Place::Table(hash, tag), e.state),
            Some(_) => (Place::Overflow, State::default()),
            None => (Place::Table(hash, tag), State::default()),
        }
    }

    /// Writes one committed state; room for new keys was made beforehand.
    pub(super) fn write(&mut self, place: &Place, check: &Check, state: State, expires: u32) {
        let (key, scope) = (&check.key, check.scope);
        let slot = Slot {
            state,
            expires,
            scope,
        };
        match *place {
            Place::Log => self.append_log(check, state, expires),
            Place::Overflow => {
                self.overflow.insert(key.as_bytes().into(), slot);
            }
            Place::Table(hash, tag) => match self.table.find_mut(hash, |e| e.hash == hash) {
                Some(e) if e.check == tag => {
                    e.state = state;
                    e.expires = expires;
                    e.scope = scope;
                }
                // Another key with this hash: the overflow map keeps both apart.
                Some(_) => {
                    self.overflow.insert(key.as_bytes().into(), slot);
                }
                None => {
                    self.table.insert_unique(
                        hash,
                        Entry {
                            hash,
                            check: tag,
                            expires,
                            state,
                            scope,
                        },
                        |e| e.hash,
                    );
                }
            },
        }
    }

    /// Adds an admitted request to its sliding log (`added`: when and how
    /// many hits, see [`crate::algorithm::append`]); room for a new log was
    /// made beforehand.
    fn append_log(&mut self, check: &Check, added: State, expires: u32) {
        let slot = self
            .logs
            .entry(check.key.as_bytes().into())
            .or_insert_with(|| LogSlot {
                log: Vec::new(),
                expires,
                scope: check.scope,
            });
        append(&mut slot.log, added, check.quota.period_ticks());
        slot.expires = expires;
        slot.scope = check.scope;
    }

    /// Writes `key`'s held IDs (an empty list deletes them).
    pub(super) fn write_held(&mut self, check: &Check, held: Vec<Held>, expires: u32) {
        if held.is_empty() {
            self.held.remove(check.key.as_bytes());
            return;
        }
        self.held.insert(
            check.key.as_bytes().into(),
            HeldSlot {
                held,
                expires,
                scope: check.scope,
            },
        );
    }

    /// Drops every entry whose state no longer matters at `now_secs`;
    /// returns how many.
    pub(super) fn sweep(&mut self, now_secs: u32) -> usize {
        let before = self.len();
        self.table.retain(|e| e.expires > now_secs);
        self.overflow.retain(|_, s| s.expires > now_secs);
        self.logs.retain(|_, s| s.expires > now_secs);
        self.held.retain(|_, s| s.expires > now_secs);
        before - self.len()
    }

    /// Copies what still matters at `now_secs` into `out`.
    pub(super) fn copy_into(&self, now_secs: u32, out: &mut ShardCopy) {
        let live = |expires: u32| expires > now_secs;
        out.counters.extend(
            self.table
                .iter()
                .filter(|e| live(e.expires))
                .map(|e| Counter {
                    hash: e.hash,
                    check: e.check,
                    expires: e.expires,
                    scope: e.scope,
                    state: e.state,
                }),
        );
        for (key, s) in self.overflow.iter().filter(|(_, s)| live(s.expires)) {
            out.overflow.push(Keyed {
                key: key.clone(),
                expires: s.expires,
                scope: s.scope,
                state: s.state,
            });
        }
        for (key, s) in self.logs.iter().filter(|(_, s)| live(s.expires)) {
            out.logs.push(LogCopy {
                key: key.clone(),
                expires: s.expires,
                scope: s.scope,
                log: s.log.clone(),
            });
        }
        for (key, s) in self.held.iter().filter(|(_, s)| live(s.expires)) {
            out.held.push(HeldCopy {
                key: key.clone(),
                expires: s.expires,
                scope: s.scope,
                held: s.held.clone(),
            });
        }
    }

    /// Puts a saved table counter back (a key held already takes it).
    pub(super) fn restore_counter(&mut self, c: Counter) {
        let entry = Entry {
            hash: c.hash,
            check: c.check,
            expires: c.expires,
            state: c.state,
            scope: c.scope,
        };
        match self.table.find_mut(c.hash, |e| e.hash == c.hash) {
            Some(e) => *e = entry,
            None => {
                self.table.insert_unique(c.hash, entry, |e| e.hash);
            }
        }
    }

    /// Puts a saved collided counter back.
    pub(super) fn restore_keyed(&mut self, k: Keyed) {
        let slot = Slot {
            state: k.state,
            expires: k.expires,
            scope: k.scope,
        };
        self.overflow.insert(k.key, slot);
    }

    /// Puts a saved sliding log back.
    pub(super) fn restore_log(&mut self, l: LogCopy) {
        let slot = LogSlot {
            log: l.log,
            expires: l.expires,
            scope: l.scope,
        };
        self.logs.insert(l.key, slot);
    }

    /// Puts a saved list of held IDs back.
    pub(super) fn restore_held(&mut self, h: HeldCopy) {
        let slot = HeldSlot {
            held: h.held,
            expires: h.expires,
            scope: h.scope,
        };
        self.held.insert(h.key, slot);
    }
}
