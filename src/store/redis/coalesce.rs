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
use super::server::Server;
use redis::Value;
use smallvec::SmallVec;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::options::{BatchBounds, RedisOptions};
use super::part::{Part, Rows, parse_reply};
use super::receipt::Calls;
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

/// Coalesces the requests of the moment into batch calls, over [`Calls`].
pub(super) struct Batcher {
    calls: Calls,
    bounds: BatchBounds,
    timeout: Duration,
}

impl Batcher {
    pub(super) fn new(calls: Calls, options: &RedisOptions) -> Self {
        Self {
            calls,
            bounds: options.batch,
            timeout: options.timeout,
        }
    }

    /// Decides `part` in `slot`, in a call of its own or together with the
    /// parts queued beside it (see the module docs), by `deadline`.
    pub(super) async fn decide_part(
        &self,
        slot: Slot,
        part: Part,
        deadline: Instant,
    ) -> Result<Rows, StoreError> {
        let timeout = self.timeout;
        let queue = QUEUES.with(|q| {
            q.borrow_mut()
                .entry((self.calls.route().id(), slot))
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
        let others = queue.take(self.bounds, part.checks.len(), timeout);
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
            Box::pin(self.calls.send(slot, &parts, until)).await
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::msgpack::Writer;
    use crate::store::redis::part::ScriptCheck;

    const TIMEOUT: Duration = Duration::from_millis(100);

    /// A part of `checks` checks.
    fn part(checks: usize) -> Part {
        Part {
            keys: Arc::from(Vec::<String>::new()),
            now_us: 0,
            checks: (0..checks)
                .map(|_| ScriptCheck {
                    code: b'f',
                    limit: 1,
                    start_or_period: 0,
                    end_or_burst: 1,
                    cost: 1,
                    charge: 1,
                    enforce: b'1',
                    id: None,
                })
                .collect(),
        }
    }

    /// Queues a request of `checks` checks with `deadline`; its answer.
    fn queue(q: &Queue, checks: usize, deadline: Instant) -> oneshot::Receiver<Answer> {
        let (answer, answered) = oneshot::channel();
        q.state.lock().waiting.push_back(Queued {
            part: part(checks),
            deadline,
            answer,
        });
        answered
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn timed_out(answered: &mut oneshot::Receiver<Answer>) -> bool {
        matches!(
            answered.try_recv(),
            Ok(Answer::Rows(Err(StoreError::Timeout(t)))) if t == TIMEOUT
        )
    }

    #[test]
    fn a_call_takes_the_live_waiters_in_order_within_its_bounds() {
        let q = Queue::default();
        let mut gone = queue(&q, 1, later());
        gone.close();
        let mut late = queue(&q, 1, Instant::now());
        let mut kept = Vec::new();
        for _ in 0..5 {
            kept.push(queue(&q, 2, later()));
        }
        // At most 4 requests in all (the leader's and 3 waiters), at most 8
        // checks (the leader's 1 and 3 x 2).
        let bounds = BatchBounds {
            requests: 4,
            checks: 8,
        };
        let batch = q.take(bounds, 1, TIMEOUT);
        assert_eq!(batch.len(), 3);
        assert!(
            timed_out(&mut late),
            "past its deadline: answered, not sent"
        );
        assert_eq!(q.state.lock().waiting.len(), 2, "the rest wait");
        // The checks bound: a leader of 6 checks takes one waiter of 2.
        let batch = q.take(
            BatchBounds {
                requests: 64,
                checks: 8,
            },
            6,
            TIMEOUT,
        );
        assert_eq!(batch.len(), 1);
        // One request per call: nothing beside the leader.
        let batch = q.take(
            BatchBounds {
                requests: 1,
                checks: 8,
            },
            1,
            TIMEOUT,
        );
        assert!(batch.is_empty());
    }

    #[test]
    fn the_lead_passes_to_the_first_live_waiter_or_the_queue_goes_idle() {
        let q = Queue::default();
        q.state.lock().in_flight = true;
        let mut gone = queue(&q, 1, later());
        gone.close();
        let mut late = queue(&q, 1, Instant::now());
        let mut next = queue(&q, 3, later());
        let mut after = queue(&q, 1, later());
        q.pass_lead(TIMEOUT);
        assert!(timed_out(&mut late));
        match next.try_recv() {
            Ok(Answer::Lead(lead)) => assert_eq!(lead.0.checks.len(), 3),
            _ => panic!("the first live waiter leads"),
        }
        assert!(
            after.try_recv().is_err(),
            "still waiting behind the new leader"
        );
        assert!(q.state.lock().in_flight);
        // That leader's call ends; the last waiter gave up meanwhile.
        after.close();
        q.pass_lead(TIMEOUT);
        assert!(
            !q.state.lock().in_flight,
            "idle: the next request sends at once"
        );
    }

    #[test]
    fn each_waiter_gets_its_own_rows_or_the_calls_error() {
        let reply = |rows: &[(u64, u64, u64)]| {
            let mut w = Writer::array(rows.len() * 3);
            for &(a, r, wait) in rows {
                w.uint(a).uint(r).uint(wait);
            }
            Value::BulkString(w.into_bytes())
        };
        let (tx1, mut rx1) = oneshot::channel();
        let (tx2, mut rx2) = oneshot::channel();
        let others = vec![
            Queued {
                part: part(2),
                deadline: later(),
                answer: tx1,
            },
            Queued {
                part: part(1),
                deadline: later(),
                answer: tx2,
            },
        ];
        let mine = deliver(
            1,
            others,
            Ok(reply(&[(1, 9, 0), (1, 8, 0), (0, 0, 5), (1, 7, 0)])),
        )
        .expect("rows");
        assert_eq!(mine, vec![(true, 9, 0)]);
        match rx1.try_recv() {
            Ok(Answer::Rows(Ok(rows))) => assert_eq!(rows, vec![(true, 8, 0), (false, 0, 5)]),
            _ => panic!("the first waiter's two rows"),
        }
        match rx2.try_recv() {
            Ok(Answer::Rows(Ok(rows))) => assert_eq!(rows, vec![(true, 7, 0)]),
            _ => panic!("the second waiter's row"),
        }
        // A reply of the wrong length is every part's error.
        let (tx, mut rx) = oneshot::channel();
        let others = vec![Queued {
            part: part(1),
            deadline: later(),
            answer: tx,
        }];
        assert!(deliver(1, others, Ok(reply(&[(1, 1, 0)]))).is_err());
        assert!(matches!(
            rx.try_recv(),
            Ok(Answer::Rows(Err(StoreError::Script(_))))
        ));
    }
}
