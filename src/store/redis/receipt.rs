//! A batch call with its receipt: when its answer does not come in time,
//! `cancel.lua` takes back whatever it committed if it ran, or stops it from
//! committing if it runs later (see `batch.lua`).

use std::sync::Arc;
use std::time::Duration;

use super::events::{CancelEnd, Events};
use super::keys::{Slot, hash_tag};
use super::options::RedisOptions;
use super::part::{Part, batch_call};
use super::route::Route;
use super::script::{Invocation, Lua, Script};
use super::server::Server;
use crate::store::StoreError;
use redis::Value;

/// Batch calls with receipts, over a [`Route`].
pub(super) struct Calls {
    route: Route,
    batch: Lua,
    cancel: Lua,
    prefix: String,
    timeout: Duration,
    probe_interval: Duration,
    /// Cancellations, for `/metrics`.
    events: Arc<Events>,
}

impl Calls {
    pub(super) fn new(route: Route, options: &RedisOptions, events: Arc<Events>) -> Self {
        Self {
            route,
            batch: Lua::of(Script::Batch),
            cancel: Lua::of(Script::Cancel),
            prefix: options.prefix.clone(),
            timeout: options.timeout,
            probe_interval: options.probe_interval,
            events,
        }
    }

    /// The route the calls take.
    pub(super) fn route(&self) -> &Route {
        &self.route
    }

    /// Sends the batch script's call for `parts` (see [`batch_call`]).
    ///
    /// The call carries a receipt (see `batch.lua`): when the answer does
    /// not come by `until` (or the connection fails, or the caller gives up),
    /// the requests are answered from the failure modes, and `cancel.lua`
    /// takes back whatever the call committed if it ran, or stops it from
    /// committing if it runs later: a request Redis did not decide spends
    /// nothing.
    pub(super) async fn send(
        &self,
        slot: Slot,
        parts: &[&Part],
        until: tokio::time::Instant,
    ) -> Result<Value, StoreError> {
        let mut inv = batch_call(&self.batch, parts);
        inv.yields_to_migration = true;
        let receipt = self.receipt(parts);
        inv.key(receipt.as_str())
            .arg(self.receipt_ttl().as_millis() as u64);
        let mut unsettled = Unsettled {
            calls: self,
            slot,
            inv: &inv,
            armed: true,
        };
        let timeout = self.timeout;
        let reply = match tokio::time::timeout_at(until, self.route.invoke(slot, &inv)).await {
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
        let mut key = String::with_capacity(self.prefix.len() + tag.len() + 32);
        key.push_str(&self.prefix);
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
    fn receipt_ttl(&self) -> Duration {
        (self.timeout * 10).clamp(
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
        let route = self.route.clone();
        let script = self.cancel.clone();
        let keys = inv.keys().to_vec();
        let ttl = self.receipt_ttl();
        let cancelling = self.events.cancelling();
        let interval = self.probe_interval;
        tokio::spawn(async move {
            let mut cancel = script.prepare_invoke();
            for key in &keys {
                cancel.key(key.as_slice());
            }
            cancel.arg(ttl.as_millis() as u64);
            let within = route.probe_within();
            let until = tokio::time::Instant::now() + CANCEL_FOR;
            loop {
                if !route.slot_open(slot) {
                    let sent = tokio::time::timeout(within, route.invoke(slot, &cancel)).await;
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
                tokio::time::sleep(interval).await;
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
    calls: &'a Calls,
    slot: Slot,
    inv: &'a Invocation<'i>,
    armed: bool,
}

impl Drop for Unsettled<'_, '_> {
    fn drop(&mut self) {
        if self.armed {
            self.calls.cancel(self.slot, self.inv);
        }
    }
}
