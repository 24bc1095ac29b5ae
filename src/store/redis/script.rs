//! The batch script's call: each request's share as a [`Part`], every part
//! of a call packed into one MessagePack argument, and the reply's rows.

use std::collections::HashMap;
use std::sync::Arc;

use super::keys::{Slot, slot_of};
use redis::Value;
use smallvec::SmallVec;

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

/// A Lua script: its SHA1 for `EVALSHA`, and its source for `EVAL` when
/// Redis does not have it (a restart, a failover, a node new to a slot).
pub(super) struct Lua {
    hash: String,
    code: String,
}

impl Lua {
    pub(super) fn new(code: String) -> Self {
        Self {
            hash: redis::Script::new(&code).get_hash().to_owned(),
            code,
        }
    }

    /// A call of this script, its keys and arguments to be added.
    pub(super) fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            lua: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`Lua`] script. Unlike the `redis` crate's invocation, it
/// can be sent as `EVAL` behind `ASKING` (a Cluster slot being migrated),
/// and it says which slot its keys are in.
pub(super) struct Invocation<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    pub(super) fn key(&mut self, key: impl redis::ToRedisArgs) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub(super) fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The hash slot of its first key (all of its keys share it).
    pub(super) fn slot(&self) -> Slot {
        slot_of(self.keys.first().map_or(&b""[..], Vec::as_slice))
    }

    /// `EVALSHA`, or `EVAL` with the source when `source`.
    fn command(&self, source: bool) -> redis::Cmd {
        let mut cmd = if source {
            redis::cmd("EVAL")
        } else {
            redis::cmd("EVALSHA")
        };
        cmd.arg(if source {
            &self.lua.code
        } else {
            &self.lua.hash
        })
        .arg(self.keys.len());
        for key in &self.keys {
            cmd.arg(key.as_slice());
        }
        for arg in &self.args {
            cmd.arg(arg.as_slice());
        }
        cmd
    }

    /// Runs the script on `conn`: by its SHA1, or by its source when Redis
    /// lacks it; `asking` sends it behind `ASKING` (an `ASK` redirection),
    /// with the source, since the importing node may lack the script.
    pub(super) async fn run(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        asking: bool,
    ) -> redis::RedisResult<Value> {
        if asking {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").ignore().add_command(self.command(true));
            let (reply,): (Value,) = pipe.query_async(conn).await?;
            return reply.extract_error();
        }
        match self.command(false).query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.command(true).query_async(conn).await
            }
            other => other,
        }
    }
}

impl RedisStore {
    /// One script call for `parts`: each distinct key once in KEYS (a hot
    /// key is in every part), the numbers as one MessagePack argument.
    pub(super) async fn send<'a>(
        &self,
        slot: Slot,
        parts: &[&'a Part],
    ) -> Result<Value, StoreError> {
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
        self.invoke(slot, &inv).await
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
