//! Counter identity: the domain, the algorithm, the unit and the descriptor's
//! entries, in one canonical byte string. The memory store keeps only a hash of
//! it (and looks at the bytes when two keys collide); the algorithm and unit
//! are part of it because their states are not interchangeable, while the
//! number of requests is not, so a reload that only changes a number keeps
//! its counters.

use smallvec::SmallVec;

use crate::algorithm::Algorithm;
use crate::rules::Unit;

/// The canonical bytes of one counter's identity. Built on the stack for
/// ordinary descriptors.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CounterKey {
    bytes: SmallVec<[u8; 112]>,
}

// Separators that cannot be confused with each other: a value containing one
// is still unambiguous because every field is length-prefixed.
impl CounterKey {
    /// Starts a key for `domain` under `algorithm` and `unit`.
    pub fn new(domain: &str, algorithm: Algorithm, unit: Unit) -> Self {
        let mut key = CounterKey::default();
        key.push(domain.as_bytes());
        key.bytes.push(algorithm as u8);
        key.bytes.push(unit as u8);
        key
    }

    /// Appends one descriptor entry.
    pub fn entry(&mut self, key: &str, value: &str) {
        self.push(key.as_bytes());
        self.push(value.as_bytes());
    }

    fn push(&mut self, field: &[u8]) {
        self.bytes
            .extend_from_slice(&(field.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(field);
    }

    /// The canonical bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}
