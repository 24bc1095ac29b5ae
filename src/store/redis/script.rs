//! The batch script's call: each request's share as a [`Part`], every part
//! of a call packed into one MessagePack argument, and the reply's rows.

use std::collections::HashMap;
use std::sync::Arc;

use redis::Value;
use smallvec::SmallVec;

use super::conn::redis_error;
use super::{RedisStore, msgpack};
use crate::store::StoreError;

/// One request's checks in one slot, as the script takes them.
pub(super) struct Part {
    /// The checks' keys, in order (two for a sliding window).
    pub(super) keys: Arc<[String]>,
    /// The request's time, in microseconds since the epoch.
    pub(super) now_us: u64,
    /// The checks' arguments, in order.
    pub(super) checks: SmallVec<[CheckArgs; 4]>,
}

/// One check's script arguments (see `batch.lua`); the keys come from the
/// part's `keys`.
pub(super) struct CheckArgs {
    /// `b'f'`, `b's'` or `b't'` (`script_code`).
    pub(super) code: u8,
    pub(super) limit: u32,
    pub(super) a: u64,
    pub(super) b: u64,
    pub(super) cost: u64,
    pub(super) charge: u64,
    /// `b'1'`, `b'0'`, `b'q'` or `b'Q'` (see `batch.lua`).
    pub(super) enforce: u8,
}

/// Numbers per check in the script's argument (see `batch.lua`).
const FIELDS: usize = 9;

/// Per check: allowed, remaining, wait (µs).
pub(super) type Rows = Vec<(bool, u32, u64)>;

impl RedisStore {
    /// One script call for `parts`: each distinct key once in KEYS (a hot
    /// key is in every part), the numbers as one MessagePack argument.
    pub(super) async fn send<'a>(&self, parts: &[&'a Part]) -> Result<Value, StoreError> {
        let mut inv = self.inner.batch.prepare_invoke();
        let numbers = 1 + parts
            .iter()
            .map(|p| 2 + p.checks.len() * FIELDS)
            .sum::<usize>();
        let mut args = msgpack::Writer::array(numbers);
        args.uint(parts.len() as u64);
        let mut index: HashMap<&str, u64> = HashMap::with_capacity(parts.len() + 1);
        let mut key_index = |key: &'a str| -> u64 {
            let next = index.len() as u64 + 1;
            *index.entry(key).or_insert_with(|| {
                inv.key(key);
                next
            })
        };
        for part in parts {
            args.uint(part.checks.len() as u64).uint(part.now_us);
            let mut keys = part.keys.iter();
            for c in &part.checks {
                let key = keys.next().map_or(0, |k| key_index(k));
                let previous = if c.code == b's' {
                    keys.next().map_or(0, |k| key_index(k))
                } else {
                    0
                };
                args.uint(u64::from(c.code))
                    .uint(key)
                    .uint(previous)
                    .uint(u64::from(c.limit))
                    .uint(c.a)
                    .uint(c.b)
                    .uint(c.cost)
                    .uint(c.charge)
                    .uint(u64::from(c.enforce));
            }
        }
        inv.arg(args.into_bytes());
        let mut conn = self.conn().await?;
        conn.invoke(&inv).await.map_err(|e| redis_error(&e))
    }
}

pub(super) fn parse_reply(
    value: Value,
    expected: usize,
) -> Result<Vec<(bool, u32, u64)>, StoreError> {
    let bad = || StoreError::Script(format!("unexpected reply from the batch script: {value:?}"));
    let Value::BulkString(bytes) = &value else {
        return Err(bad());
    };
    let numbers = msgpack::read_numbers(bytes).ok_or_else(bad)?;
    if numbers.len() != expected * 3 {
        return Err(bad());
    }
    Ok(numbers
        .chunks_exact(3)
        .map(|row| {
            (
                row[0] == 1,
                u32::try_from(row[1]).unwrap_or(if row[1] < 0 { 0 } else { u32::MAX }),
                u64::try_from(row[2]).unwrap_or(0),
            )
        })
        .collect())
}
