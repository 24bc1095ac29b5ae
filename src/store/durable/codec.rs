//! One chunk of a data directory: a run of counters (or a shard's keyed
//! counters and sliding logs) as bytes, little-endian, behind a checksum.
//!
//! ```text
//! u64 xxh3 of what follows
//! u32 n, n × counter: u64 hash, u32 check, u32 expires, u64 scope, State
//! u32 n, n × keyed:   u32 len, key, u32 expires, u64 scope, State
//! u32 n, n × log:     u32 len, key, u32 expires, u64 scope, u32 m, m × (u64 at, u32 hits)
//! u32 n, n × held:    u32 len, key, u32 expires, u64 scope, u32 m,
//!                     m × (u32 len, id, u64 amount, u64 until)
//! State: u64 at, u32 current, u32 previous
//! ```
//!
//! A counter takes 40 bytes; the file is read whole at start, so every
//! length is checked against the bytes left before anything is made of it.

use crate::algorithm::{Held, Logged, State};
use crate::store::memory::{Counter, HeldCopy, Keyed, LogCopy, ShardCopy};

/// Bytes of one table counter.
pub(super) const COUNTER_BYTES: usize = 40;

/// `copy` as a chunk's bytes (checksum first); `None` for an empty copy.
pub(super) fn encode(copy: &ShardCopy, out: &mut Vec<u8>) -> Option<u64> {
    out.clear();
    if copy.is_empty() {
        return None;
    }
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&(copy.counters.len() as u32).to_le_bytes());
    for c in &copy.counters {
        out.extend_from_slice(&c.hash.to_le_bytes());
        out.extend_from_slice(&c.check.to_le_bytes());
        head(out, c.expires, c.scope);
        state(out, &c.state);
    }
    out.extend_from_slice(&(copy.overflow.len() as u32).to_le_bytes());
    for k in &copy.overflow {
        key(out, &k.key);
        head(out, k.expires, k.scope);
        state(out, &k.state);
    }
    out.extend_from_slice(&(copy.logs.len() as u32).to_le_bytes());
    for l in &copy.logs {
        key(out, &l.key);
        head(out, l.expires, l.scope);
        out.extend_from_slice(&(l.log.len() as u32).to_le_bytes());
        for e in &l.log {
            out.extend_from_slice(&e.at.to_le_bytes());
            out.extend_from_slice(&e.hits.to_le_bytes());
        }
    }
    out.extend_from_slice(&(copy.held.len() as u32).to_le_bytes());
    for h in &copy.held {
        key(out, &h.key);
        head(out, h.expires, h.scope);
        out.extend_from_slice(&(h.held.len() as u32).to_le_bytes());
        for e in &h.held {
            key(out, &e.id);
            out.extend_from_slice(&e.amount.to_le_bytes());
            out.extend_from_slice(&e.until.to_le_bytes());
        }
    }
    let sum = xxhash_rust::xxh3::xxh3_64(&out[8..]);
    out[..8].copy_from_slice(&sum.to_le_bytes());
    Some(sum)
}

fn key(out: &mut Vec<u8>, key: &[u8]) {
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key);
}

fn head(out: &mut Vec<u8>, expires: u32, scope: u64) {
    out.extend_from_slice(&expires.to_le_bytes());
    out.extend_from_slice(&scope.to_le_bytes());
}

fn state(out: &mut Vec<u8>, s: &State) {
    out.extend_from_slice(&s.at.to_le_bytes());
    out.extend_from_slice(&s.current.to_le_bytes());
    out.extend_from_slice(&s.previous.to_le_bytes());
}

/// The checksum a chunk carries (`None`: too short to carry one).
pub(super) fn checksum(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
}

/// A chunk read back into `out` (appended); the error says what is wrong.
pub(super) fn decode(bytes: &[u8], out: &mut ShardCopy) -> Result<(), &'static str> {
    let sum = checksum(bytes).ok_or("shorter than its checksum")?;
    let mut r = Reader(&bytes[8..]);
    if xxhash_rust::xxh3::xxh3_64(r.0) != sum {
        return Err("its checksum does not match its contents");
    }
    let n = r.count(COUNTER_BYTES)?;
    out.counters.reserve(n);
    for _ in 0..n {
        let (hash, check) = (r.u64()?, r.u32()?);
        let (expires, scope) = (r.u32()?, r.u64()?);
        let state = r.state()?;
        out.counters.push(Counter {
            hash,
            check,
            expires,
            scope,
            state,
        });
    }
    for _ in 0..r.count(4)? {
        let (key, expires, scope) = r.keyed()?;
        let state = r.state()?;
        out.overflow.push(Keyed {
            key,
            expires,
            scope,
            state,
        });
    }
    for _ in 0..r.count(4)? {
        let (key, expires, scope) = r.keyed()?;
        let m = r.count(12)?;
        let log = (0..m)
            .map(|_| {
                Ok(Logged {
                    at: r.u64()?,
                    hits: r.u32()?,
                })
            })
            .collect::<Result<Vec<_>, &'static str>>()?;
        out.logs.push(LogCopy {
            key,
            expires,
            scope,
            log,
        });
    }
    // Held request IDs (a chunk written before they were kept has none).
    let lists = if r.0.is_empty() { 0 } else { r.count(4)? };
    for _ in 0..lists {
        let (key, expires, scope) = r.keyed()?;
        let m = r.count(20)?;
        let held = (0..m)
            .map(|_| {
                Ok(Held {
                    id: r.key()?.into(),
                    amount: r.u64()?,
                    until: r.u64()?,
                })
            })
            .collect::<Result<Vec<_>, &'static str>>()?;
        out.held.push(HeldCopy {
            key,
            expires,
            scope,
            held,
        });
    }
    if !r.0.is_empty() {
        return Err("it has bytes after its last record");
    }
    Ok(())
}

struct Reader<'a>(&'a [u8]);

const SHORT: &str = "it ends inside a record";

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], &'static str> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or(SHORT)?;
        self.0 = rest;
        Ok(*head)
    }

    fn u32(&mut self) -> Result<u32, &'static str> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, &'static str> {
        self.take().map(u64::from_le_bytes)
    }

    /// A count of records of at least `each` bytes, no more than the bytes
    /// left could hold.
    fn count(&mut self, each: usize) -> Result<usize, &'static str> {
        let n = self.u32()? as usize;
        if n.saturating_mul(each) > self.0.len() {
            return Err(SHORT);
        }
        Ok(n)
    }

    fn key(&mut self) -> Result<Box<[u8]>, &'static str> {
        let len = self.u32()? as usize;
        if len > self.0.len() {
            return Err(SHORT);
        }
        let (key, rest) = self.0.split_at(len);
        self.0 = rest;
        Ok(key.into())
    }

    /// A keyed record's head: its key, expiry and owner.
    fn keyed(&mut self) -> Result<(Box<[u8]>, u32, u64), &'static str> {
        Ok((self.key()?, self.u32()?, self.u64()?))
    }

    fn state(&mut self) -> Result<State, &'static str> {
        Ok(State {
            at: self.u64()?,
            current: self.u32()?,
            previous: self.u32()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ShardCopy {
        let state = State {
            at: 7,
            current: 3,
            previous: 2,
        };
        ShardCopy {
            counters: vec![Counter {
                hash: u64::MAX,
                check: 9,
                expires: 100,
                scope: 5,
                state,
            }],
            overflow: vec![Keyed {
                key: b"k".as_slice().into(),
                expires: 101,
                scope: 6,
                state,
            }],
            logs: vec![LogCopy {
                key: b"log".as_slice().into(),
                expires: 102,
                scope: 7,
                log: vec![Logged { at: 1, hits: 2 }, Logged { at: 3, hits: 4 }],
            }],
            held: vec![HeldCopy {
                key: b"cap".as_slice().into(),
                expires: 103,
                scope: 8,
                held: vec![Held {
                    id: b"req-1".as_slice().into(),
                    amount: 1,
                    until: 104,
                }],
            }],
        }
    }

    #[test]
    fn a_chunk_reads_back_as_written() {
        let mut bytes = Vec::new();
        let sum = encode(&sample(), &mut bytes);
        assert_eq!(sum, checksum(&bytes));
        let mut back = ShardCopy::default();
        decode(&bytes, &mut back).expect("decodes");
        assert_eq!(back, sample());
        assert_eq!(encode(&ShardCopy::default(), &mut bytes), None);
    }

    #[test]
    fn every_cut_and_every_flipped_byte_is_refused() {
        let mut bytes = Vec::new();
        encode(&sample(), &mut bytes);
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len], &mut ShardCopy::default()).is_err(),
                "cut at {len}"
            );
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad, &mut ShardCopy::default()).is_err(), "byte {i}");
        }
    }
}
