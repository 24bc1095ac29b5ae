//! Exact coalescing: requests waiting on one connection for one hash slot at
//! the same moment are decided by one script call.
//!
//! Redis spends most of a decision on invoking a script at all (a script
//! that only returns 1 tops out near 90k calls/s on the development
//! machine), so one call per request caps the Redis path far below the
//! memory store. Here each worker thread keeps, per store and slot, a queue
//! and an "in flight" lock. A request queues its share of the call (its
//! [`Part`]) and takes the lock: if no call is in flight it sends at once,
//! alone (an idle server adds no delay); if one is, it waits, and whoever
//! takes the lock next sends everything queued meanwhile as one call, up to
//! the bounds. `batch.lua` decides the parts in queue order, each all or
//! nothing, each seeing what the earlier ones spent: exactly the decisions
//! of one call per request, made in that order.
//!
//! A request that gives up while queued (its deadline passed) is skipped;
//! one whose call was abandoned half-way (the sender's deadline passed) is
//! answered with a timeout, like a call of its own that timed out.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use redis::Value;
use redis::cluster_routing::Slot;
use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::{RedisStore, parse_reply, redis_error};
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

/// One check's seven script arguments (see `batch.lua`).
pub(super) struct CheckArgs {
    pub(super) code: &'static str,
    pub(super) limit: u32,
    pub(super) a: u64,
    pub(super) b: u64,
    pub(super) cost: u64,
    pub(super) charge: u64,
    pub(super) enforce: &'static str,
}

/// Per check: allowed, remaining, wait (µs).
pub(super) type Rows = Vec<(bool, u32, u64)>;

struct Queued {
    part: Part,
    answer: oneshot::Sender<Result<Rows, StoreError>>,
}

/// How much one call may carry: the script runs while Redis serves no one
/// else, so a call's size bounds everyone's wait.
#[derive(Debug, Clone, Copy)]
pub struct BatchBounds {
    /// Requests per call (`--redis-batch`); 1 sends every request alone.
    pub requests: usize,
    /// Checks per call; a request larger than this goes alone.
    pub checks: usize,
}

impl Default for BatchBounds {
    fn default() -> Self {
        Self {
            requests: 64,
            checks: 1024,
        }
    }
}

/// One slot's queue on one thread.
#[derive(Default)]
struct Queue {
    waiting: parking_lot::Mutex<VecDeque<Queued>>,
    in_flight: tokio::sync::Mutex<()>,
}

impl Queue {
    /// The next call's parts, from the front: live ones, within `bounds`.
    fn take(&self, bounds: BatchBounds) -> Vec<Queued> {
        let mut waiting = self.waiting.lock();
        let mut batch: Vec<Queued> = Vec::new();
        let mut checks = 0;
        while let Some(next) = waiting.front() {
            if next.answer.is_closed() {
                // Its request stopped waiting: nothing to decide, nothing to spend.
                waiting.pop_front();
                continue;
            }
            let size = next.part.checks.len();
            let full = batch.len() >= bounds.requests.max(1)
                || (!batch.is_empty() && checks + size > bounds.checks);
            if full {
                break;
            }
            checks += size;
            batch.extend(waiting.pop_front());
        }
        batch
    }
}

thread_local! {
    /// This thread's queues, by store id and slot.
    static QUEUES: std::cell::RefCell<HashMap<(usize, Slot), Arc<Queue>>> =
        std::cell::RefCell::new(HashMap::new());
}

impl RedisStore {
    /// Decides `part` in `slot`, in a call of its own or together with the
    /// parts queued beside it (see the module docs).
    pub(super) async fn decide_part(&self, slot: Slot, part: Part) -> Result<Rows, StoreError> {
        let queue = QUEUES.with(|q| {
            q.borrow_mut()
                .entry((self.inner.id, slot))
                .or_default()
                .clone()
        });
        let (answer, mut answered) = oneshot::channel();
        queue.waiting.lock().push_back(Queued { part, answer });
        loop {
            let _in_flight = queue.in_flight.lock().await;
            match answered.try_recv() {
                Ok(rows) => return rows,
                // The call carrying it was abandoned by its sender.
                Err(oneshot::error::TryRecvError::Closed) => {
                    return Err(StoreError::Timeout(self.inner.options.timeout));
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            // Ours is still queued: send the front of the queue, ours among
            // it unless the bounds cut it off (then the next round).
            let batch = queue.take(self.inner.options.batch);
            let reply = {
                let parts: SmallVec<[&Part; 8]> = batch.iter().map(|q| &q.part).collect();
                self.send(&parts).await
            };
            deliver(batch, reply);
        }
    }

    /// One script call for `parts`.
    async fn send(&self, parts: &[&Part]) -> Result<Value, StoreError> {
        let mut inv = self.inner.batch.prepare_invoke();
        inv.arg(parts.len());
        for part in parts {
            for key in part.keys.iter() {
                inv.key(key.as_str());
            }
            inv.arg(part.checks.len()).arg(part.now_us);
            for c in &part.checks {
                inv.arg(c.code)
                    .arg(c.limit)
                    .arg(c.a)
                    .arg(c.b)
                    .arg(c.cost)
                    .arg(c.charge)
                    .arg(c.enforce);
            }
        }
        let mut conn = self.conn().await?;
        conn.invoke(&inv).await.map_err(|e| redis_error(&e))
    }
}

/// Hands each queued request its rows (or the call's error).
fn deliver(batch: Vec<Queued>, reply: Result<Value, StoreError>) {
    let total: usize = batch.iter().map(|q| q.part.checks.len()).sum();
    let rows = reply.and_then(|v| parse_reply(v, total));
    let mut rows = match rows {
        Ok(rows) => rows.into_iter(),
        Err(e) => {
            for queued in batch {
                let _ = queued.answer.send(Err(e.clone()));
            }
            return;
        }
    };
    for queued in batch {
        let mine: Rows = rows.by_ref().take(queued.part.checks.len()).collect();
        // A request that stopped waiting no longer reads its answer.
        let _ = queued.answer.send(Ok(mine));
    }
}
