//! The batch script's call: each request's share as a [`Part`], every part
//! of a call packed into one MessagePack argument, and the reply's rows.

use std::collections::HashMap;
use std::sync::Arc;

use super::keys::{Slot, hash_tag, slot_of};
use redis::Value;
use smallvec::SmallVec;

use super::events::CancelEnd;
use super::{RedisStore, msgpack};
use crate::store::StoreError;

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
}

impl ScriptCheck {
    /// Its numbers in the script's argument, with its key's index in KEYS
    /// and its previous window's (0 for none).
    pub(super) fn write(&self, args: &mut msgpack::Writer, key: u64, previous: u64) {
        args.uint(u64::from(self.code))
            .uint(key)
            .uint(previous)
            .uint(u64::from(self.limit))
            .uint(self.start_or_period)
            .uint(self.end_or_burst)
            .uint(self.cost)
            .uint(self.charge)
            .uint(u64::from(self.enforce));
    }
}

/// Numbers per check in the script's argument (see `batch.lua`).
pub(super) const FIELDS: usize = 9;

/// Per check: allowed, remaining, wait (µs).
pub(super) type Rows = Vec<(bool, u32, u64)>;

const ALGORITHMS: &str = concat!(
    "local ALGORITHMS = {}\n",
    include_str!("fixed_window.lua"),
    include_str!("sliding_window.lua"),
    include_str!("token_bucket.lua"),
);

/// Every script the store sends, each a `.lua` file beside this one.
pub(super) struct Scripts {
    /// Decides the checks of one call's parts (the three algorithms, then
    /// the batch driver, `batch.lua`).
    pub(super) batch: Lua,
    /// Gives back what checks spent (`refund.lua`).
    pub(super) refund: Lua,
    /// Takes back a call that ran late, by its receipt (`cancel.lua`).
    pub(super) cancel: Lua,
    /// Deletes counters (`reset.lua`).
    pub(super) reset: Lua,
    /// Publishes and reads the instances' views of who is limited
    /// (`views.lua`).
    pub(super) views: Lua,
    /// The quota service's totals exchange (`quota.lua`).
    pub(super) quota: Lua,
    /// Reads one counter (`peek.lua`): a sliding window's previous window on
    /// a slot being migrated.
    pub(super) peek: Lua,
}

impl Default for Scripts {
    fn default() -> Self {
        let lua = |source: &str| Lua::new(source.to_owned());
        Self {
            batch: Lua::new(format!("{ALGORITHMS}{}", include_str!("batch.lua"))),
            refund: lua(include_str!("refund.lua")),
            cancel: lua(include_str!("cancel.lua")),
            reset: lua(include_str!("reset.lua")),
            views: lua(include_str!("views.lua")),
            quota: lua(include_str!("quota.lua")),
            peek: lua(include_str!("peek.lua")),
        }
    }
}

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
            yields_to_migration: false,
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
    /// A `TRYAGAIN` ends the call with [`StoreError::Migrating`] instead of
    /// being retried: its caller decides it another way (see
    /// `migration.rs`).
    pub(super) yields_to_migration: bool,
}

impl Invocation<'_> {
    /// Its keys, in order.
    pub(super) fn keys(&self) -> &[Vec<u8>] {
        &self.keys
    }

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
    ///
    /// The call carries a receipt (see `batch.lua`): when the answer does
    /// not come by `until` (or the connection fails, or the caller gives up),
    /// the requests are answered from the failure modes, and `cancel.lua`
    /// takes back whatever the call committed if it ran, or stops it from
    /// committing if it runs later: a request Redis did not decide spends
    /// nothing.
    pub(super) async fn send<'a>(
        &self,
        slot: Slot,
        parts: &[&'a Part],
        until: tokio::time::Instant,
    ) -> Result<Value, StoreError> {
        let mut inv = self.inner.scripts.batch.prepare_invoke();
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
                c.write(&mut args, key, previous);
            }
        }
        inv.arg(args.into_bytes());
        inv.yields_to_migration = true;
        let receipt = self.receipt(parts);
        inv.key(receipt.as_str())
            .arg(self.receipt_ttl().as_millis() as u64);
        let mut unsettled = Unsettled {
            store: self,
            slot,
            inv: &inv,
            armed: true,
        };
        let timeout = self.inner.options.timeout;
        let reply = match tokio::time::timeout_at(until, self.invoke(slot, &inv)).await {
            Ok(reply) => reply,
            Err(_) => Err(StoreError::Timeout(timeout)),
        };
        // Settled: an answer, or an error that says the call was not run
        // (the breaker, a refusal by Redis before the script).
        unsettled.armed = match &reply {
            Ok(_) => false,
            Err(StoreError::Timeout(_)) => true,
            Err(StoreError::Redis { transient, .. }) => *transient,
            Err(_) => false,
        };
        reply
    }

    /// The key of a call's receipt: in the slot of its first key (every key
    /// of a call shares a slot), unique to this process and call.
    fn receipt(&self, parts: &[&Part]) -> String {
        let first = parts
            .iter()
            .find_map(|p| p.keys.first())
            .map_or("", String::as_str);
        // The tag as Redis reads it (keys.rs), so the slots agree.
        let tag = hash_tag(first.as_bytes())
            .and_then(|t| std::str::from_utf8(t).ok())
            .unwrap_or("");
        let n = RECEIPTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut key = String::with_capacity(self.inner.options.prefix.len() + tag.len() + 32);
        key.push_str(&self.inner.options.prefix);
        key.push('{');
        key.push_str(tag);
        key.push_str("}:call:");
        key.push_str(receipt_seed());
        key.push('.');
        key.push_str(itoa::Buffer::new().format(n));
        key
    }

    /// How long a receipt (and a cancellation) stands: long enough for a
    /// cancellation sent at the deadline to find the call it follows.
    fn receipt_ttl(&self) -> std::time::Duration {
        (self.inner.options.timeout * 10).clamp(
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(60),
        )
    }

    /// Sends `cancel.lua` for the call `inv` in the background. Redis (or
    /// the slot's master) may be unreachable for now, with the call waiting
    /// in its socket: the cancellation is retried every probe interval while
    /// the breaker is closed, for up to [`CANCEL_FOR`]. Whichever of the two
    /// runs first, the request spends nothing (see `cancel.lua`).
    fn cancel(&self, slot: Slot, inv: &Invocation<'_>) {
        let store = self.clone();
        let keys = inv.keys().to_vec();
        let ttl = self.receipt_ttl();
        let cancelling = self.inner.events.cancelling();
        tokio::spawn(async move {
            let mut cancel = store.inner.scripts.cancel.prepare_invoke();
            for key in &keys {
                cancel.key(key.as_slice());
            }
            cancel.arg(ttl.as_millis() as u64);
            let options = &store.inner.options;
            let within = store.inner.connections.probe_within();
            let until = tokio::time::Instant::now() + CANCEL_FOR;
            loop {
                if !store.slot_open(slot) {
                    let sent = tokio::time::timeout(within, store.invoke(slot, &cancel)).await;
                    match sent {
                        Ok(Ok(_)) => return cancelling.ended(CancelEnd::Delivered),
                        Ok(Err(error)) if !error.is_transient() => {
                            tracing::debug!(%error, "cancelling a call with no answer failed; what it committed, if it ran, stays spent");
                            return cancelling.ended(CancelEnd::Abandoned);
                        }
                        _ => {}
                    }
                }
                if tokio::time::Instant::now() >= until {
                    tracing::debug!(
                        "no cancellation delivered for a call with no answer; what it committed, if it ran, stays spent"
                    );
                    return cancelling.ended(CancelEnd::Abandoned);
                }
                tokio::time::sleep(options.probe_interval).await;
            }
        });
    }
}

/// How long a call with no answer is cancelled for: a hung Redis that
/// resumes within it runs the call and its cancellation, in either order.
const CANCEL_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// Receipts made by this process.
static RECEIPTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// This process's part of receipt names: random, so that instances (and a
/// restarted one) never share a receipt.
fn receipt_seed() -> &'static str {
    static SEED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SEED.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        format!("{:016x}", h.finish())
    })
}

/// A sent call whose outcome is unknown until disarmed: dropped armed (no
/// answer by the deadline, a failed connection, the caller gone), it sends
/// the cancellation.
struct Unsettled<'a, 'i> {
    store: &'a RedisStore,
    slot: Slot,
    inv: &'a Invocation<'i>,
    armed: bool,
}

impl Drop for Unsettled<'_, '_> {
    fn drop(&mut self) {
        if self.armed {
            self.store.cancel(self.slot, self.inv);
        }
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
