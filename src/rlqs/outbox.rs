//! What a stream has to send, bounded in bytes: an answer echoes every
//! bucket id of its report (values up to `--max-value-bytes` each), so a
//! stream that never reads its answers is held to `--rlqs-max-queued-bytes`,
//! not to a count of messages (16 answers of 500 KB each grew 200 such
//! streams to 1.7 GB).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::answer::Answer;

/// Messages queued at most, whatever their size (the bytes bound them
/// first unless they are tiny).
const QUEUE_MESSAGES: usize = 1024;

/// The sending side of a stream's queue (cloned for the tick's pushes).
#[derive(Debug, Clone)]
pub(super) struct Outbox {
    tx: mpsc::Sender<(Answer, usize)>,
    queued: Arc<AtomicUsize>,
    max_bytes: usize,
}

/// The receiving side: what the stream sends, in order.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct Inbox {
    rx: mpsc::Receiver<(Answer, usize)>,
    queued: Arc<AtomicUsize>,
}

/// A queue for one stream, holding at most `max_bytes` of messages.
pub(super) fn outbox(max_bytes: usize) -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::channel(QUEUE_MESSAGES);
    let queued = Arc::new(AtomicUsize::new(0));
    (
        Outbox {
            tx,
            queued: queued.clone(),
            max_bytes,
        },
        Inbox { rx, queued },
    )
}

impl Outbox {
    /// Queues `message`; false when the queue is full (the stream does not
    /// read what it was sent) or the stream is gone.
    pub(super) fn push(&self, message: Answer) -> bool {
        let size = message.encoded_len();
        let held = self.queued.fetch_add(size, Ordering::AcqRel);
        if held.saturating_add(size) > self.max_bytes && held > 0 {
            self.queued.fetch_sub(size, Ordering::AcqRel);
            return false;
        }
        if self.tx.try_send((message, size)).is_err() {
            self.queued.fetch_sub(size, Ordering::AcqRel);
            return false;
        }
        true
    }
}

impl Inbox {
    /// The next message queued, if any (tests read pushes with it).
    #[cfg(test)]
    pub(crate) fn try_recv(&mut self) -> Option<Answer> {
        let (message, size) = self.rx.try_recv().ok()?;
        self.queued.fetch_sub(size, Ordering::AcqRel);
        Some(message)
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Answer>> {
        self.rx.poll_recv(cx).map(|next| {
            next.map(|(message, size)| {
                self.queued.fetch_sub(size, Ordering::AcqRel);
                message
            })
        })
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
                    self.inbox.rx.close();
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
