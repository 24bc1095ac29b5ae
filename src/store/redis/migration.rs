//! Decisions on a Redis Cluster slot being migrated, one key per call.
//!
//! While a slot moves (`CLUSTER SETSLOT ... MIGRATING`/`IMPORTING`, then
//! `MIGRATE` a batch of keys at a time), Redis serves a call on the source
//! only if every key it declares is still there, sends it to the target
//! (`ASK`) only if none is, and there serves it with several keys only if
//! all of them exist; anything else is `TRYAGAIN`. A batch call always
//! declares a key that exists on neither node (its receipt), and often a
//! new counter or a sliding window's two windows split between the nodes,
//! so on a migrating slot it is answered `TRYAGAIN` until the whole slot
//! has moved: seconds for a slot of 100,000 keys.
//!
//! A call of one key is always served: on the source while the key is
//! there, else on the target behind `ASKING`, whether the key exists or is
//! new. So each check is decided by a call of its own key alone, with no
//! receipt; a sliding window's previous window (a window that has ended, so
//! it no longer grows) is read first by a call of its own and handed to the
//! script as a value. A request of several checks stays all or nothing:
//! they are asked first without spending, then spent one by one, and what
//! was spent is given back if a check is refused in between.
//!
//! Without a receipt a call that times out cannot be taken back: its hits,
//! if it ran, stay spent (the error is on the side of refusing). This only
//! applies while a slot migrates.

use std::time::Duration;

use super::keys::Slot;
use super::msgpack;
use super::options::RedisOptions;
use super::part::{FIELDS, Part, Rows, ScriptCheck, parse_reply};
use super::refund::Refunds;
use super::route::Route;
use super::script::{Lua, Script};
use super::server::Server;
use crate::store::StoreError;
use redis::Value;

/// Decides key by key on a slot being migrated, over a [`Route`].
pub(super) struct Migrating {
    route: Route,
    batch: Lua,
    peek: Lua,
    refunds: Refunds,
    timeout: Duration,
}

impl Migrating {
    pub(super) fn new(route: Route, refunds: Refunds, options: &RedisOptions) -> Self {
        Self {
            route,
            batch: Lua::of(Script::Batch),
            peek: Lua::of(Script::Peek),
            refunds,
            timeout: options.timeout,
        }
    }

    /// Decides `part` on `slot`, which is being migrated, by the request's
    /// `deadline`: as the batch script would, one key per call.
    pub(super) async fn decide(
        &self,
        slot: Slot,
        part: &Part,
        deadline: tokio::time::Instant,
    ) -> Result<Rows, StoreError> {
        // A held ID's list and its counter are written together; a slot
        // half moved may hold one and not the other.
        if part.checks.iter().any(|c| c.id.is_some()) {
            return Err(StoreError::Redis {
                message: "a Cluster slot being migrated cannot hold request IDs (in_flight, reserve) for now".into(),
                transient: true,
            });
        }
        let decide = async {
            let keys = keys_of(part);
            if let ([check], [keys]) = (part.checks.as_slice(), keys.as_slice()) {
                let row = self
                    .decide_alone(slot, keys, check, check.charge, part.now_us)
                    .await?;
                return Ok(vec![row]);
            }
            // Several checks: asked first, spending nothing.
            let mut asked = Vec::with_capacity(part.checks.len());
            for (check, k) in part.checks.iter().zip(&keys) {
                asked.push(self.decide_alone(slot, k, check, 0, part.now_us).await?);
            }
            if blocked(&part.checks, &asked) {
                return Ok(asked);
            }
            let mut spent = Vec::with_capacity(part.checks.len());
            for (check, k) in part.checks.iter().zip(&keys) {
                let row = self
                    .decide_alone(slot, k, check, check.charge, part.now_us)
                    .await;
                match row {
                    Ok(row) => spent.push(row),
                    Err(error) => {
                        // Not decided by Redis: what the request spent so
                        // far goes back.
                        self.take_back(slot, part, &keys, &spent).await;
                        return Err(error);
                    }
                }
            }
            if blocked(&part.checks, &spent) {
                // Refused in between (another request spent the room).
                self.take_back(slot, part, &keys, &spent).await;
            }
            Ok(spent)
        };
        match tokio::time::timeout_at(deadline, decide).await {
            Ok(rows) => rows,
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// One check in a call of its own key, spending `charge`.
    async fn decide_alone(
        &self,
        slot: Slot,
        keys: &CheckKeys<'_>,
        check: &ScriptCheck,
        charge: u64,
        now_us: u64,
    ) -> Result<(bool, u32, u64), StoreError> {
        let previous = match keys.previous {
            Some(key) => Some(self.peek(slot, key).await?),
            None => None,
        };
        let mut inv = self.batch.prepare_invoke();
        inv.key(keys.current);
        let mut args = msgpack::Writer::array(3 + FIELDS);
        args.uint(1).uint(1).uint(now_us);
        let check = ScriptCheck {
            charge,
            id: check.id.clone(),
            ..*check
        };
        check.write(&mut args, 1, if previous.is_some() { 2 } else { 0 });
        // No receipt (an empty lifetime), then the previous window's value.
        inv.arg(args.into_bytes()).arg("");
        if let Some(value) = previous {
            let mut given = msgpack::Writer::array(1);
            given.uint(value);
            inv.arg(given.into_bytes());
        }
        let reply = self.route.invoke(slot, &inv).await?;
        parse_reply(reply, 1)?
            .pop()
            .ok_or_else(|| StoreError::Script("no row from the batch script".into()))
    }

    /// The value of counter `key` (0 when there is none), read alone.
    async fn peek(&self, slot: Slot, key: &str) -> Result<u64, StoreError> {
        let mut inv = self.peek.prepare_invoke();
        inv.key(key);
        Ok(match self.route.invoke(slot, &inv).await? {
            Value::BulkString(bytes) => counter_value(&bytes),
            Value::SimpleString(text) => counter_value(text.as_bytes()),
            Value::Int(n) => u64::try_from(n).unwrap_or(0),
            _ => 0,
        })
    }

    /// Gives back what the admitted checks among `rows` spent, one key per
    /// call; a failure leaves them spent (on the side of refusing), logged.
    async fn take_back(&self, slot: Slot, part: &Part, keys: &[CheckKeys<'_>], rows: &Rows) {
        for ((check, keys), &(allowed, _, _)) in part.checks.iter().zip(keys).zip(rows) {
            if !allowed || check.charge == 0 {
                continue;
            }
            let interval = match check.code {
                b't' => (check.start_or_period / u64::from(check.limit.max(1))).max(1),
                // The entry of the request's time.
                b'l' => part.now_us,
                _ => 1,
            };
            let refunded = self
                .refunds
                .key(slot, keys.current, (check.code, check.charge, interval))
                .await;
            if refunded.is_err() {
                tracing::warn!(
                    "giving back a refused request's hits on a migrating Cluster slot failed; they stay spent"
                );
            }
        }
    }
}

/// One check's keys within a part.
struct CheckKeys<'a> {
    current: &'a str,
    /// A sliding window's previous window.
    previous: Option<&'a str>,
}

/// Each check's keys, in order (a sliding window has two).
fn keys_of(part: &Part) -> Vec<CheckKeys<'_>> {
    let mut keys = part.keys.iter().map(String::as_str);
    part.checks
        .iter()
        .map(|c| CheckKeys {
            current: keys.next().unwrap_or(""),
            previous: if c.code == b's' { keys.next() } else { None },
        })
        .collect()
}

/// Whether a request with these rows is refused as a whole (as `batch.lua`
/// decides it): an enforced check refused, or every quota-mode check.
fn blocked(checks: &[ScriptCheck], rows: &Rows) -> bool {
    let (mut quota, mut quota_refused) = (0, 0);
    for (check, &(allowed, _, _)) in checks.iter().zip(rows) {
        match check.enforce {
            b'1' if !allowed => return true,
            b'q' => {
                quota += 1;
                if !allowed {
                    quota_refused += 1;
                }
            }
            _ => {}
        }
    }
    quota > 0 && quota == quota_refused
}

/// A counter's value as the scripts read it: a number, else 0.
fn counter_value(bytes: &[u8]) -> u64 {
    let text = std::str::from_utf8(bytes).unwrap_or("").trim();
    text.parse::<u64>()
        .ok()
        .or_else(|| {
            text.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .map(|v| v as u64)
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use smallvec::smallvec;
    use std::sync::Arc;

    fn check(code: u8, enforce: u8) -> ScriptCheck {
        ScriptCheck {
            code,
            limit: 10,
            start_or_period: 0,
            end_or_burst: 60_000_000,
            cost: 1,
            charge: 1,
            enforce,
            id: None,
        }
    }

    #[test]
    fn each_check_has_its_keys_a_sliding_window_two() {
        let part = Part {
            keys: Arc::from(vec!["a".to_owned(), "s".into(), "s-1".into(), "t".into()]),
            now_us: 0,
            checks: smallvec![check(b'f', b'1'), check(b's', b'1'), check(b't', b'1')],
        };
        let keys: Vec<(&str, Option<&str>)> = keys_of(&part)
            .iter()
            .map(|k| (k.current, k.previous))
            .collect();
        assert_eq!(
            keys,
            [("a", None), ("s", Some("s-1")), ("t", None)],
            "keys in the order the batch script takes them"
        );
    }

    #[test]
    fn a_request_is_blocked_as_the_batch_script_blocks_it() {
        let row = |allowed| (allowed, 0, 0);
        let enforced = [check(b'f', b'1'), check(b'f', b'1')];
        assert!(!blocked(&enforced, &vec![row(true), row(true)]));
        assert!(blocked(&enforced, &vec![row(true), row(false)]));
        // Shadow and caller-decided quota checks never block.
        let never = [check(b'f', b'0'), check(b'f', b'Q')];
        assert!(!blocked(&never, &vec![row(false), row(false)]));
        // Quota mode: only when every quota-mode check is refused.
        let quota = [check(b'f', b'q'), check(b'f', b'q')];
        assert!(!blocked(&quota, &vec![row(false), row(true)]));
        assert!(blocked(&quota, &vec![row(false), row(false)]));
    }

    #[test]
    fn a_counter_reads_as_the_scripts_read_it() {
        assert_eq!(counter_value(b"42"), 42);
        assert_eq!(counter_value(b" 7"), 7);
        assert_eq!(counter_value(b"7.5"), 7);
        assert_eq!(counter_value(b"x"), 0);
        assert_eq!(counter_value(b"-3"), 0);
    }
}
