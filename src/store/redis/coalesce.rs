//! Exact coalescing: requests waiting on one connection for one hash slot at
//! the same moment are decided by one script call.
//!
//! Redis spends most of a decision on invoking a script at all (a script
//! that only returns 1 tops out near 90k calls/s on the development
//! machine), so one call per request caps the Redis path far below the
//! memory store. Here each worker thread keeps, per store and slot, a queue
//! with at most one call in flight. A request (its share of the call, a
//! [`Part`]) that finds no call in flight sends at once, alone: an idle
//! server adds no delay. One that finds a call in flight queues and waits;
//! when the call returns, its sender hands every waiter its rows and hands
//! the first waiter the lead, which sends its own part and everything queued
//! behind it as the next call, up to the bounds. Each request is woken once.
//! `batch.lua` decides the parts in queue order, each all or nothing, each
//! seeing what the earlier ones spent: exactly the decisions of one call per
//! request, made in that order.
//!
//! A request that gives up while queued (its deadline passed) is skipped,
//! and if it had been told to lead, the lead passes on; one whose call was
//! abandoned half-way (the sender's deadline passed) is answered with a
//! timeout, like a call of its own that timed out.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use redis::Value;
use redis::cluster_routing::Slot;
use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::{RedisStore, msgpack, parse_reply, redis_error};
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

struct Queued {
    part: Part,
    answer: oneshot::Sender<Answer>,
}

/// What a queued request is told: its rows, or that it sends the next call.
enum Answer {
    Rows(Result<Rows, StoreError>),
    // Boxed: a part is large, and a lead is handed on once per call.
    Lead(Box<Part>),
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

/// One slot's queue on one thread: the requests waiting, and whether a call
/// is in flight (then exactly one request, the leader, owns it).
#[derive(Default)]
struct Queue {
    state: parking_lot::Mutex<State>,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Queued>,
    in_flight: bool,
}

impl Queue {
    /// Parts to send with the leader's `checks`, from the front: live ones,
    /// within `bounds`.
    fn take(&self, bounds: BatchBounds, mut checks: usize) -> Vec<Queued> {
        let mut state = self.state.lock();
        let mut batch: Vec<Queued> = Vec::new();
        while let Some(next) = state.waiting.front() {
            if next.answer.is_closed() {
                // Its request stopped waiting: nothing to decide, nothing to spend.
                state.waiting.pop_front();
                continue;
            }
            let size = next.part.checks.len();
            if batch.len() + 1 >= bounds.requests.max(1) || checks + size > bounds.checks {
                break;
            }
            checks += size;
            batch.extend(state.waiting.pop_front());
        }
        batch
    }

    /// The leader's call is over (or abandoned): the first live waiter
    /// leads the next call, or the queue goes idle.
    fn pass_lead(&self) {
        let mut state = self.state.lock();
        while let Some(next) = state.waiting.pop_front() {
            if next.answer.send(Answer::Lead(Box::new(next.part))).is_ok() {
                return;
            }
        }
        state.in_flight = false;
    }
}

/// Held by the leader: passes the lead on however the call ends, so a
/// leader whose request gives up cannot stall the queue.
struct Leading<'a>(&'a Queue);

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        self.0.pass_lead();
    }
}

/// A queued request's wait. If it gives up after being told to lead but
/// before leading, the lead passes on.
struct Waiting<'a> {
    queue: &'a Queue,
    answered: Option<oneshot::Receiver<Answer>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(Ok(Answer::Lead(_))) = self.answered.as_mut().map(|a| a.try_recv()) {
            self.queue.pass_lead();
        }
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
        let (answer, answered) = oneshot::channel();
        let lead = {
            let mut state = queue.state.lock();
            if state.in_flight {
                state.waiting.push_back(Queued { part, answer });
                None
            } else {
                state.in_flight = true;
                Some(part)
            }
        };
        let part = match lead {
            Some(part) => part,
            None => {
                let mut waiting = Waiting {
                    queue: &queue,
                    answered: Some(answered),
                };
                let told = waiting.answered.as_mut().expect("set above").await;
                waiting.answered = None;
                match told {
                    Ok(Answer::Rows(rows)) => return rows,
                    Ok(Answer::Lead(part)) => *part,
                    // The call carrying it was abandoned by its sender.
                    Err(_) => return Err(StoreError::Timeout(self.inner.options.timeout)),
                }
            }
        };
        let _leading = Leading(&queue);
        let others = queue.take(self.inner.options.batch, part.checks.len());
        let reply = {
            let mut parts: SmallVec<[&Part; 8]> = SmallVec::with_capacity(others.len() + 1);
            parts.push(&part);
            parts.extend(others.iter().map(|q| &q.part));
            // Boxed: the client's future is large, and every request's
            // future would carry (and move) it; only a leader sends.
            Box::pin(self.send(&parts)).await
        };
        deliver(part.checks.len(), others, reply)
    }

    /// One script call for `parts`: each distinct key once in KEYS (a hot
    /// key is in every part), the numbers as one MessagePack argument.
    async fn send<'a>(&self, parts: &[&'a Part]) -> Result<Value, StoreError> {
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

/// Hands each queued request its rows (or the call's error); returns the
/// leader's, the first `own` rows.
fn deliver(
    own: usize,
    others: Vec<Queued>,
    reply: Result<Value, StoreError>,
) -> Result<Rows, StoreError> {
    let total = own + others.iter().map(|q| q.part.checks.len()).sum::<usize>();
    let rows = match reply.and_then(|v| parse_reply(v, total)) {
        Ok(rows) => rows,
        Err(e) => {
            for queued in others {
                let _ = queued.answer.send(Answer::Rows(Err(e.clone())));
            }
            return Err(e);
        }
    };
    let mut rows = rows.into_iter();
    let mine: Rows = rows.by_ref().take(own).collect();
    for queued in others {
        let theirs: Rows = rows.by_ref().take(queued.part.checks.len()).collect();
        // A request that stopped waiting no longer reads its answer.
        let _ = queued.answer.send(Answer::Rows(Ok(theirs)));
    }
    Ok(mine)
}
