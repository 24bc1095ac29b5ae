//! Counter identity: the domain, the algorithm, the period (unit, multiplier
//! and calendar zone) and the descriptor's entries, in one canonical byte
//! string. The memory store keeps only a hash of
//! it (and looks at the bytes when two keys collide); the algorithm and unit
//! are part of it because their states are not interchangeable, while the
//! number of requests is not, so a reload that only changes a number keeps
//! its counters.

use smallvec::SmallVec;

use crate::algorithm::Algorithm;
use crate::period::Unit;

/// The canonical bytes of one counter's identity. Built on the stack for
/// ordinary descriptors.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CounterKey {
    bytes: SmallVec<[u8; 112]>,
}

// Separators that cannot be confused with each other: a value containing one
// is still unambiguous because every field is length-prefixed.
impl CounterKey {
    /// Starts a key for `domain` under `algorithm`, per one `unit`.
    pub fn new(domain: &str, algorithm: Algorithm, unit: Unit) -> Self {
        Self::with_period(domain, algorithm, unit, 1, None)
    }

    /// Starts a key for `domain` under `algorithm`, per `every` `unit`s,
    /// on the calendar of `zone` when given.
    pub fn with_period(
        domain: &str,
        algorithm: Algorithm,
        unit: Unit,
        every: u32,
        zone: Option<&str>,
    ) -> Self {
        let mut key = CounterKey::default();
        key.push(domain.as_bytes());
        // The algorithm byte's high bits say which optional fields follow,
        // so the common key (one unit, no calendar) is as short and as quick
        // to build as ever: every request builds one per limit.
        let flags = if every != 1 { EVERY } else { 0 } | if zone.is_some() { ZONE } else { 0 };
        key.bytes
            .extend_from_slice(&[algorithm as u8 | flags, unit as u8]);
        if every != 1 {
            key.bytes.extend_from_slice(&every.to_le_bytes());
        }
        if let Some(zone) = zone {
            key.push(zone.as_bytes());
        }
        key
    }

    /// Starts the key of an in-flight cap in `domain`: never the key of a
    /// counter, and the same whatever the cap's limit and longest hold (a
    /// reload that changes them keeps the slots held).
    pub fn in_flight(domain: &str) -> Self {
        let mut key = Self::new(domain, Algorithm::FixedWindow, Unit::Second);
        if let Some(a) = key.bytes.get_mut(4 + domain.len()) {
            *a |= IN_FLIGHT;
        }
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

    /// The key's parts, read back from the canonical bytes.
    pub fn parts(&self) -> KeyParts<'_> {
        let mut rest = self.as_bytes();
        let domain = take_field(&mut rest).unwrap_or_default();
        let (algorithm, unit, flags) = match rest {
            [a, u, tail @ ..] => {
                rest = tail;
                (
                    Algorithm::ALL
                        .get(usize::from(*a & !(EVERY | ZONE | IN_FLIGHT)))
                        .copied(),
                    Unit::ALL.get(usize::from(*u)).copied(),
                    *a & (EVERY | ZONE | IN_FLIGHT),
                )
            }
            _ => (None, None, 0),
        };
        let mut every = 1;
        if flags & EVERY != 0
            && let [e0, e1, e2, e3, tail @ ..] = rest
        {
            every = u32::from_le_bytes([*e0, *e1, *e2, *e3]);
            rest = tail;
        }
        let zone = if flags & ZONE != 0 {
            take_field(&mut rest)
        } else {
            None
        };
        let mut entries = SmallVec::new();
        while let (Some(k), Some(v)) = (take_field(&mut rest), take_field(&mut rest)) {
            entries.push((k, v));
        }
        KeyParts {
            in_flight: flags & IN_FLIGHT != 0,
            domain,
            algorithm: algorithm.unwrap_or(Algorithm::SlidingWindow),
            unit: unit.unwrap_or(Unit::Second),
            every,
            zone,
            entries,
        }
    }
}

/// Flags on the algorithm byte: a unit multiplier (4 bytes) follows.
const EVERY: u8 = 0x40;
/// Flags on the algorithm byte: a calendar zone (a field) follows.
const ZONE: u8 = 0x80;
/// Flags on the algorithm byte: an in-flight cap's held IDs, not a counter.
const IN_FLIGHT: u8 = 0x20;

/// Reads one length-prefixed field off the front of `rest`. The fields were
/// written from `&str`s, so they are always UTF-8.
fn take_field<'a>(rest: &mut &'a [u8]) -> Option<&'a str> {
    let len = rest
        .get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)?;
    let bytes = rest.get(4..4 + len)?;
    *rest = rest.get(4 + len..).unwrap_or_default();
    std::str::from_utf8(bytes).ok()
}

/// A counter key's parts (see [`CounterKey::parts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyParts<'a> {
    /// The domain.
    pub domain: &'a str,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// The unit.
    pub unit: Unit,
    /// Units per period.
    pub every: u32,
    /// The calendar's time zone, for calendar periods.
    pub zone: Option<&'a str>,
    /// The descriptor entries (with shared wildcard values already substituted).
    pub entries: SmallVec<[(&'a str, &'a str); 4]>,
    /// An in-flight cap's held IDs (see [`CounterKey::in_flight`]).
    pub in_flight: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_read_back_what_was_written() {
        let mut key =
            CounterKey::with_period("api", Algorithm::TokenBucket, Unit::Week, 3, Some("UTC"));
        key.entry("user", "a|b=c");
        key.entry("", "");
        let parts = key.parts();
        assert_eq!(parts.domain, "api");
        assert_eq!(
            (parts.algorithm, parts.unit, parts.every, parts.zone),
            (Algorithm::TokenBucket, Unit::Week, 3, Some("UTC"))
        );
        let plain = CounterKey::new("api", Algorithm::TokenBucket, Unit::Week);
        assert_eq!((plain.parts().every, plain.parts().zone), (1, None));
        let five = CounterKey::with_period("api", Algorithm::FixedWindow, Unit::Minute, 5, None);
        assert_eq!(
            (five.parts().unit, five.parts().every, five.parts().zone),
            (Unit::Minute, 5, None)
        );
        assert_ne!(
            five,
            CounterKey::new("api", Algorithm::FixedWindow, Unit::Minute)
        );
        assert_eq!(parts.entries.as_slice(), &[("user", "a|b=c"), ("", "")]);
        assert!(!parts.in_flight);
        let mut cap = CounterKey::in_flight("api");
        cap.entry("user", "ann");
        let mut counter = CounterKey::new("api", Algorithm::FixedWindow, Unit::Second);
        counter.entry("user", "ann");
        assert_ne!(cap, counter, "a cap's key is never a counter's");
        let parts = cap.parts();
        assert!(parts.in_flight);
        assert_eq!(parts.entries.as_slice(), &[("user", "ann")]);
    }
}
