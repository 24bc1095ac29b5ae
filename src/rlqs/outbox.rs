//! What a stream has to send, bounded in bytes and merged per bucket.
//!
//! An answer echoes every bucket id of its report (values up to
//! `--max-value-bytes` each). What waits for a stream is one message: a
//! new answer or push for a bucket already waiting replaces it (only the
//! latest assignment matters, and delivering it renews the TTL), so a
//! stream that does not read holds at most one action per bucket it
//! reports, not one per report and tick. The wire size of what waits is
//! held to `--rlqs-max-queued-bytes` (16 answers of 500 KB each grew 200
//! streams that never read to 1.7 GB when answers were queued whole).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse;
use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tonic::Status;

use super::answer::{Action, Answer, Entries};

/// The sending side of a stream's queue (cloned for the tick's pushes).
#[derive(Debug)]
pub(super) struct Outbox {
    shared: Arc<Shared>,
    max_bytes: usize,
}

/// The receiving side: what the stream sends, merged.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct Inbox {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    waiting: Mutex<Waiting>,
    /// The receiver, woken by a push or by the last sender going.
    waker: AtomicWaker,
    /// Outboxes alive: none left ends the stream's messages.
    senders: AtomicUsize,
}

/// The one message waiting: an action per bucket, in the order the buckets
/// were first named, each with its wire size.
#[derive(Debug, Default)]
struct Waiting {
    actions: Vec<(Action, usize)>,
    at: HashMap<Entries, usize>,
    bytes: usize,
    ttl: Duration,
    /// The receiver is gone.
    closed: bool,
}

/// A queue for one stream, holding at most `max_bytes` (wire size).
pub(super) fn outbox(max_bytes: usize) -> (Outbox, Inbox) {
    let shared = Arc::new(Shared {
        senders: AtomicUsize::new(1),
        ..Shared::default()
    });
    (
        Outbox {
            shared: shared.clone(),
            max_bytes,
        },
        Inbox { shared },
    )
}

impl Clone for Outbox {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::AcqRel);
        Self {
            shared: self.shared.clone(),
            max_bytes: self.max_bytes,
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.waker.wake();
        }
    }
}

impl Outbox {
    /// Merges `answer` into what waits for the stream; false, changing
    /// nothing, when that would pass the byte bound (the stream does not
    /// read what it was sent) or the stream is gone.
    pub(super) fn push(&self, answer: Answer) -> bool {
        let ttl = answer.ttl;
        let sized: Vec<(Action, usize)> = answer
            .actions
            .into_iter()
            .map(|a| {
                let size = a.encoded_len(ttl);
                (a, size)
            })
            .collect();
        {
            let mut waiting = self.shared.waiting.lock();
            if waiting.closed {
                return false;
            }
            let after = sized.iter().fold(waiting.bytes, |bytes, (action, size)| {
                let replaced = waiting
                    .at
                    .get(&action.bucket)
                    .map_or(0, |&i| waiting.actions[i].1);
                bytes.saturating_sub(replaced).saturating_add(*size)
            });
            if after > self.max_bytes && waiting.bytes > 0 {
                return false;
            }
            let waiting = &mut *waiting;
            for (action, size) in sized {
                match waiting.at.get(&action.bucket) {
                    Some(&i) => {
                        waiting.bytes = waiting.bytes - waiting.actions[i].1 + size;
                        waiting.actions[i] = (action, size);
                    }
                    None => {
                        waiting
                            .at
                            .insert(action.bucket.clone(), waiting.actions.len());
                        waiting.bytes += size;
                        waiting.actions.push((action, size));
                    }
                }
            }
            waiting.ttl = ttl;
        }
        self.shared.waker.wake();
        true
    }
}

impl Inbox {
    /// What waits, if anything (tests read pushes with it).
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Option<Answer> {
        self.take()
    }

    /// Takes what waits, as one answer.
    fn take(&self) -> Option<Answer> {
        let mut waiting = self.shared.waiting.lock();
        if waiting.actions.is_empty() {
            return None;
        }
        waiting.at.clear();
        waiting.bytes = 0;
        Some(Answer {
            actions: std::mem::take(&mut waiting.actions)
                .into_iter()
                .map(|(a, _)| a)
                .collect(),
            ttl: waiting.ttl,
        })
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Answer>> {
        self.shared.waker.register(cx.waker());
        if let Some(answer) = self.take() {
            return Poll::Ready(Some(answer));
        }
        if self.shared.senders.load(Ordering::Acquire) == 0 {
            return Poll::Ready(None);
        }
        Poll::Pending
    }

    /// Drops what waits and refuses what comes.
    fn close(&self) {
        let mut waiting = self.shared.waiting.lock();
        waiting.closed = true;
        waiting.actions = Vec::new();
        waiting.at = HashMap::new();
        waiting.bytes = 0;
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.close();
    }
}

/// A stream's response body: the queued messages, ended early by the
/// status its reader gives up with (no report for too long, a queue it does
/// not read, a bad report).
#[derive(Debug)]
pub(crate) struct Outbound {
    inbox: Inbox,
    ended: Option<oneshot::Receiver<Status>>,
    done: bool,
}

impl Outbound {
    /// The body over `inbox`, ended when `ended` gives a status.
    pub(super) fn new(inbox: Inbox, ended: oneshot::Receiver<Status>) -> Self {
        Self {
            inbox,
            ended: Some(ended),
            done: false,
        }
    }
}

impl futures_util::Stream for Outbound {
    type Item = Result<RateLimitQuotaResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(ended) = self.ended.as_mut() {
            match Pin::new(ended).poll(cx) {
                Poll::Ready(Ok(status)) => {
                    // What is queued is dropped: the stream ends now.
                    self.done = true;
                    self.inbox.close();
                    return Poll::Ready(Some(Err(status)));
                }
                // The reader ended without a status: the queue drains.
                Poll::Ready(Err(_)) => self.ended = None,
                Poll::Pending => {}
            }
        }
        self.inbox
            .poll_recv(cx)
            .map(|next| next.map(|answer| Ok(answer.into_wire())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rlqs::answer::ActionKind;
    use crate::rlqs::share::Assignment;

    fn bucket(value: &str) -> Entries {
        vec![("api_key".to_owned(), value.to_owned())].into()
    }

    fn answer(pairs: &[(&str, Assignment)]) -> Answer {
        Answer {
            actions: pairs
                .iter()
                .map(|(v, a)| Action {
                    bucket: bucket(v),
                    kind: ActionKind::Assign(*a),
                })
                .collect(),
            ttl: Duration::from_secs(15),
        }
    }

    fn assignments(answer: &Answer) -> Vec<(String, Assignment)> {
        answer
            .actions
            .iter()
            .map(|a| match a.kind {
                ActionKind::Assign(x) => (a.bucket[0].1.clone(), x),
                ActionKind::Abandon => (a.bucket[0].1.clone(), Assignment::DenyAll),
            })
            .collect()
    }

    #[test]
    fn what_waits_is_one_message_with_the_latest_action_per_bucket() {
        use Assignment::{AllowAll, DenyAll};
        let (tx, mut rx) = outbox(1 << 20);
        assert!(tx.push(answer(&[("a", AllowAll), ("b", AllowAll)])));
        assert!(tx.push(answer(&[("b", DenyAll), ("c", AllowAll)])));
        assert!(tx.clone().push(answer(&[("a", DenyAll)])));
        let merged = rx.try_recv().expect("waiting");
        assert_eq!(
            assignments(&merged),
            [
                ("a".to_owned(), DenyAll),
                ("b".to_owned(), DenyAll),
                ("c".to_owned(), AllowAll)
            ],
            "in the order first named, each bucket's latest"
        );
        assert!(rx.try_recv().is_none(), "taken whole");
    }

    #[test]
    fn the_byte_bound_refuses_what_would_pass_it_and_changes_nothing() {
        use Assignment::{AllowAll, DenyAll};
        let one = answer(&[("a", AllowAll)]).encoded_len();
        let (tx, mut rx) = outbox(2 * one);
        assert!(tx.push(answer(&[("a", AllowAll)])));
        assert!(tx.push(answer(&[("b", AllowAll)])));
        // A replacement takes no more room; a third bucket would.
        assert!(tx.push(answer(&[("a", DenyAll)])));
        assert!(!tx.push(answer(&[("c", AllowAll), ("a", AllowAll)])));
        let merged = rx.try_recv().expect("waiting");
        assert_eq!(
            assignments(&merged),
            [("a".to_owned(), DenyAll), ("b".to_owned(), AllowAll)]
        );
        // With nothing waiting, one message passes whatever its size.
        let (tx, _rx) = outbox(1);
        assert!(tx.push(answer(&[("a", AllowAll), ("b", AllowAll)])));
    }

    #[test]
    fn the_stream_ends_when_its_senders_are_gone_and_a_closed_one_takes_nothing() {
        let (tx, mut rx) = outbox(1 << 20);
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(rx.poll_recv(&mut cx).is_pending());
        assert!(tx.push(answer(&[("a", Assignment::AllowAll)])));
        let pushes = tx.clone();
        drop(tx);
        assert!(matches!(rx.poll_recv(&mut cx), Poll::Ready(Some(_))));
        assert!(rx.poll_recv(&mut cx).is_pending(), "a sender is left");
        drop(pushes);
        assert!(matches!(rx.poll_recv(&mut cx), Poll::Ready(None)));

        let (tx, rx) = outbox(1 << 20);
        drop(rx);
        assert!(
            !tx.push(answer(&[("a", Assignment::AllowAll)])),
            "the stream is gone"
        );
    }
}
