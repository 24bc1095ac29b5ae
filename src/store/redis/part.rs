//! One request's share of a batch call (a [`Part`]: its checks in one
//! slot), every part of a call packed into the script's arguments, and the
//! reply's rows (see `batch.lua`).

use std::collections::HashMap;
use std::sync::Arc;

use redis::Value;
use smallvec::SmallVec;

use super::msgpack;
use super::script::{Invocation, Lua};
use crate::calendar::Window;
use crate::store::{Check, StoreError, refused};

/// One request's checks in one slot, as the script takes them.
pub(super) struct Part {
    /// The checks' keys, in order (two for a sliding window).
    pub(super) keys: Arc<[String]>,
    /// The request's time, in microseconds since the epoch.
    pub(super) now_us: u64,
    /// The checks' arguments, in order.
    pub(super) checks: SmallVec<[ScriptCheck; 4]>,
}

/// One check's script arguments (see `batch.lua`); the keys come from the
/// part's `keys`.
pub(super) struct ScriptCheck {
    /// `b'f'`, `b's'` or `b't'` (`script_code`).
    pub(super) code: u8,
    pub(super) limit: u32,
    /// The window's start (µs) for the windows; the period (µs) for the
    /// token bucket.
    pub(super) start_or_period: u64,
    /// The window's end (µs) for the windows; the burst for the token
    /// bucket.
    pub(super) end_or_burst: u64,
    pub(super) cost: u64,
    pub(super) charge: u64,
    /// `b'1'`, `b'0'`, `b'q'` or `b'Q'` (see `batch.lua`).
    pub(super) enforce: u8,
    /// The request ID a call holds, frees or settles (`held.lua`).
    pub(super) id: Option<Box<[u8]>>,
}

impl ScriptCheck {
    /// Its numbers in the script's argument, with its key's index in KEYS
    /// and its previous window's (0 for none).
    /// A held-ID call's ID rides where its code takes no number (see
    /// `held.lua`): an in-flight cap's in place of the previous key, a
    /// budget's in place of the window's start.
    pub(super) fn write(&self, args: &mut msgpack::Writer, key: u64, previous: u64) {
        let id = self.id.as_deref().unwrap_or_default();
        args.uint(u64::from(self.code)).uint(key);
        match self.code {
            b'i' | b'o' => args.str(id),
            _ => args.uint(previous),
        };
        args.uint(u64::from(self.limit));
        match self.code {
            b'r' | b'e' => args.str(id),
            _ => args.uint(self.start_or_period),
        };
        args.uint(self.end_or_burst)
            .uint(self.cost)
            .uint(self.charge)
            .uint(u64::from(self.enforce));
    }
}

/// Numbers per check in the script's argument (see `batch.lua`).
pub(super) const FIELDS: usize = 9;

/// Per check: allowed, remaining, wait (µs).
pub(super) type Rows = Vec<(bool, u32, u64)>;

/// One hash slot's share of a request.
pub(super) struct Group {
    pub(super) checks: SmallVec<[usize; 4]>,
    /// The checks' keys, in order; shared with the script call's [`Part`].
    pub(super) keys: Arc<[String]>,
    /// Each check's window, in ticks (the scripts take the caller's windows).
    pub(super) windows: SmallVec<[Window; 4]>,
    /// Every enforced quota-mode check of the request is in this group, so
    /// the script can apply the quota-mode rule itself.
    pub(super) quota_here: bool,
}

impl Group {
    /// Whether the script refused (and so committed nothing) for this group.
    pub(super) fn refused_here(&self, checks: &[Check]) -> bool {
        let mine = self.checks.iter().map(|&i| &checks[i]);
        if self.quota_here {
            refused(mine)
        } else {
            refused(mine.filter(|c| !c.quota_mode))
        }
    }
}

/// The batch script's call for `parts`: each distinct key once in KEYS (a
/// hot key is in every part), the numbers as one MessagePack argument. The
/// caller adds the receipt (see `receipt.rs`).
pub(super) fn batch_call<'l, 'a>(lua: &'l Lua, parts: &[&'a Part]) -> Invocation<'l> {
    let mut inv = lua.prepare_invoke();
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
            // A sliding window's previous window; a budget's held IDs.
            let previous = if matches!(c.code, b's' | b'r' | b'e') {
                keys.next().map_or(0, |k| key_index(k))
            } else {
                0
            };
            c.write(&mut args, key, previous);
        }
    }
    inv.arg(args.into_bytes());
    inv
}

/// The rows of a reply to a call of `expected` checks.
pub(super) fn parse_reply(value: Value, expected: usize) -> Result<Rows, StoreError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;

    fn check(code: u8, charge: u64) -> ScriptCheck {
        ScriptCheck {
            code,
            limit: 10,
            start_or_period: 100,
            end_or_burst: 200,
            cost: charge,
            charge,
            enforce: b'1',
            id: None,
        }
    }

    fn part(keys: &[&str], now_us: u64, checks: SmallVec<[ScriptCheck; 4]>) -> Part {
        Part {
            keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            now_us,
            checks,
        }
    }

    #[test]
    fn a_call_names_each_key_once_and_packs_each_part_in_order() {
        let lua = Lua::new("return 1".into());
        // A hot key in both parts; a sliding window (two keys) in the first.
        let a = part(
            &["hot", "s", "s-1"],
            7,
            smallvec![check(b'f', 1), check(b's', 2)],
        );
        let b = part(&["hot"], 8, smallvec![check(b'f', 3)]);
        let call = batch_call(&lua, &[&a, &b]);
        let keys: Vec<&[u8]> = call.keys().iter().map(Vec::as_slice).collect();
        assert_eq!(keys, [&b"hot"[..], b"s", b"s-1"], "each key once, in order");
        let [args] = call.args() else {
            panic!("one argument before the receipt's")
        };
        let n = msgpack::read_numbers(args).expect("MessagePack numbers");
        let field =
            |at: usize| -> [i64; FIELDS] { n[at..at + FIELDS].try_into().expect("a check") };
        assert_eq!(n.len(), 1 + (2 + 2 * FIELDS) + (2 + FIELDS));
        assert_eq!(n[0], 2, "parts");
        assert_eq!(n[1..3], [2, 7], "the first part's checks and time");
        // code, key, previous window's key, limit, start, end, cost, charge, enforce
        assert_eq!(field(3), [102, 1, 0, 10, 100, 200, 1, 1, 49]);
        assert_eq!(field(3 + FIELDS), [115, 2, 3, 10, 100, 200, 2, 2, 49]);
        let second = 3 + 2 * FIELDS;
        assert_eq!(n[second..second + 2], [1, 8], "the second part's");
        assert_eq!(
            field(second + 2),
            [102, 1, 0, 10, 100, 200, 3, 3, 49],
            "the hot key is key 1 again"
        );
    }

    #[test]
    fn a_reply_is_three_numbers_per_check_or_an_error() {
        let reply = |numbers: &[u64]| {
            let mut w = msgpack::Writer::array(numbers.len());
            for &v in numbers {
                w.uint(v);
            }
            Value::BulkString(w.into_bytes())
        };
        let rows = parse_reply(reply(&[1, 9, 0, 0, 0, 1_500]), 2).expect("two rows");
        assert_eq!(rows, [(true, 9, 0), (false, 0, 1_500)]);
        assert!(parse_reply(reply(&[1, 9, 0]), 2).is_err(), "a row short");
        assert!(parse_reply(Value::Nil, 1).is_err(), "not a string");
        let big = parse_reply(reply(&[1, u64::from(u32::MAX) + 5, 0]), 1).expect("a row");
        assert_eq!(big[0].1, u32::MAX, "remaining saturates");
    }
}
