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
//! Each request has a deadline (`--redis-timeout` from when it asked), and
//! is answered by it, with one timer per call rather than one per request
//! (a timer costs more than the rest of a queued request's wait): a call is
//! bounded by the earliest deadline among its parts, and a queued part
//! whose deadline has passed before a call could take it is answered with a
//! timeout instead of being sent. A queued request cannot wait longer: the
//! calls ahead of it carry parts queued before it, with earlier deadlines.
//! A request that gives up while queued (its future dropped) is skipped, and
//! if it had been told to lead, the lead passes on; one whose call was
//! abandoned half-way (the sender gave up) is answered with a timeout, like
//! a call of its own that timed out.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::keys::Slot;
use redis::Value;
use smallvec::SmallVec;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::RedisStore;
use super::script::{Part, Rows, parse_reply};
use crate::store::StoreError;

struct Queued {
    part: Part,
    /// When the request stops waiting for Redis.
    deadline: Instant,
    answer: oneshot::Sender<Answer>,
}

/// What a queued request is told: its rows, or that it sends the next call.
enum Answer {
    Rows(Result<Rows, StoreError>),
    // Boxed: a part is large, and a lead is handed on once per call.
    Lead(Box<(Part, Instant)>),
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
    /// within `bounds`. Parts past their deadline are answered with a
    /// timeout (`timeout` names the bound).
    fn take(&self, bounds: BatchBounds, mut checks: usize, timeout: Duration) -> Vec<Queued> {
        let now = Instant::now();
        let mut state = self.state.lock();
        let mut batch: Vec<Queued> = Vec::new();
        while let Some(next) = state.waiting.front() {
            if next.answer.is_closed() {
                // Its request stopped waiting: nothing to decide, nothing to spend.
                state.waiting.pop_front();
                continue;
            }
            if next.deadline <= now {
                if let Some(late) = state.waiting.pop_front() {
                    let _ = late
                        .answer
                        .send(Answer::Rows(Err(StoreError::Timeout(timeout))));
                }
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
    /// within its deadline leads the next call (those past it are answered
    /// with a timeout, naming `timeout`), or the queue goes idle.
    fn pass_lead(&self, timeout: Duration) {
        let now = Instant::now();
        let mut state = self.state.lock();
        while let Some(next) = state.waiting.pop_front() {
            let told = if next.deadline <= now {
                Answer::Rows(Err(StoreError::Timeout(timeout)))
            } else {
                Answer::Lead(Box::new((next.part, next.deadline)))
            };
            let leads = matches!(told, Answer::Lead(_));
            if next.answer.send(told).is_ok() && leads {
                return;
            }
        }
        state.in_flight = false;
    }
}

/// Held by the leader: passes the lead on however the call ends, so a
/// leader whose request gives up cannot stall the queue.
struct Leading<'a>(&'a Queue, Duration);

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        self.0.pass_lead(self.1);
    }
}

/// A queued request's wait. If it gives up after being told to lead but
/// before leading, the lead passes on.
struct Waiting<'a> {
    queue: &'a Queue,
    answered: Option<oneshot::Receiver<Answer>>,
    timeout: Duration,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(Ok(Answer::Lead(_))) = self.answered.as_mut().map(|a| a.try_recv()) {
            self.queue.pass_lead(self.timeout);
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
    /// parts queued beside it (see the module docs), by `deadline`.
    pub(super) async fn decide_part(
        &self,
        slot: Slot,
        part: Part,
        deadline: Instant,
    ) -> Result<Rows, StoreError> {
        let timeout = self.inner.options.timeout;
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
                state.waiting.push_back(Queued {
                    part,
                    deadline,
                    answer,
                });
                None
            } else {
                state.in_flight = true;
                // Boxed, as a lead handed on is: a part is large, and every
                // request's future would hold a place for each move of it.
                Some(Box::new((part, deadline)))
            }
        };
        let lead = match lead {
            Some(lead) => lead,
            None => {
                // No timer here: the calls ahead answer it by its deadline.
                let mut waiting = Waiting {
                    queue: &queue,
                    answered: Some(answered),
                    timeout,
                };
                // Set just above; taken back (below, or in Drop) only after.
                let Some(answered) = waiting.answered.as_mut() else {
                    return Err(StoreError::Timeout(timeout));
                };
                let told = answered.await;
                waiting.answered = None;
                match told {
                    Ok(Answer::Rows(rows)) => return rows,
                    Ok(Answer::Lead(lead)) => lead,
                    // The call carrying it was abandoned by its sender.
                    Err(_) => return Err(StoreError::Timeout(timeout)),
                }
            }
        };
        let (part, deadline) = &*lead;
        let _leading = Leading(&queue, timeout);
        let others = queue.take(self.inner.options.batch, part.checks.len(), timeout);
        // The call's one timer: the earliest deadline of its parts.
        let until = others
            .iter()
            .map(|q| q.deadline)
            .fold(*deadline, Instant::min);
        let reply = {
            let mut parts: SmallVec<[&Part; 8]> = SmallVec::with_capacity(others.len() + 1);
            parts.push(part);
            parts.extend(others.iter().map(|q| &q.part));
            // Boxed with its timer: the client's future is large, and every
            // request's future would carry (and move) both; only a leader
            // sends.
            Box::pin(self.send(slot, &parts, until)).await
        };
        deliver(part.checks.len(), others, reply)
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
