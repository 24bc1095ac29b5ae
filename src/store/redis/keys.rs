//! Redis key names and Cluster hash slots.
//!
//! `tollgate:{api|user=ann|org=acme}:sw:minute:29512345` — prefix, then the
//! descriptor in a hash tag (so every key of one descriptor lives in one
//! slot), the algorithm, the unit and, for the windows, the window number.

use std::fmt::Write;

use crate::algorithm::Algorithm;
use crate::clock::Nanos;
use crate::store::CounterKey;

/// The Redis keys of one check: one, or two for the sliding window (current
/// window first).
pub(super) fn key_names(prefix: &str, key: &CounterKey, now: Nanos) -> ([String; 2], usize) {
    let parts = key.parts();
    let mut base = String::with_capacity(64);
    base.push_str(prefix);
    base.push('{');
    base.push_str(parts.domain);
    for (k, v) in &parts.entries {
        let _ = write!(base, "|{k}={v}");
    }
    base.push('}');
    let code = algorithm_code(parts.algorithm);
    let unit = parts.unit.name();
    let window = now / parts.unit.nanos();
    match parts.algorithm {
        Algorithm::FixedWindow => ([format!("{base}:{code}:{unit}:{window}"), String::new()], 1),
        Algorithm::SlidingWindow => (
            [
                format!("{base}:{code}:{unit}:{window}"),
                format!("{base}:{code}:{unit}:{}", window.saturating_sub(1)),
            ],
            2,
        ),
        Algorithm::TokenBucket => ([format!("{base}:{code}:{unit}"), String::new()], 1),
    }
}

/// Short algorithm names used in key names.
fn algorithm_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::TokenBucket => "tb",
    }
}

/// The algorithm's code in the scripts' arguments.
pub(super) fn script_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "f",
        Algorithm::SlidingWindow => "s",
        Algorithm::TokenBucket => "t",
    }
}

/// The Redis Cluster hash slot of `key` (CRC16/XMODEM of the hash tag, or of
/// the whole key when it has none, modulo 16384).
pub(super) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Unit;

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}"));
        assert_eq!(
            slot("{}x"),
            crc16(b"{}x") % 16384,
            "an empty tag hashes the whole key"
        );
    }

    #[test]
    fn names_are_readable_and_share_a_slot() {
        let mut key = CounterKey::new("api", Algorithm::SlidingWindow, Unit::Minute);
        key.entry("user", "ann");
        let ([current, previous], n) = key_names("tollgate:", &key, 120 * 1_000_000_000);
        assert_eq!(n, 2);
        assert_eq!(current, "tollgate:{api|user=ann}:sw:minute:2");
        assert_eq!(previous, "tollgate:{api|user=ann}:sw:minute:1");
        assert_eq!(slot(&current), slot(&previous));
    }
}
