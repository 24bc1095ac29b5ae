//! A request body that hands its gRPC messages on whole, for the quota
//! service's long-lived streams.
//!
//! tonic's decoder reserves a message's declared length as soon as it reads
//! the 5-byte prefix: 9,000 streams that each sent a prefix declaring 131 KB
//! and nothing more held 1.3 GB. Here a message's bytes are kept as they
//! arrive (memory follows what the client really sent, which flow control
//! bounds per stream and connection) and passed on once complete; a
//! declared length above the bound is passed on at once, for the decoder to
//! refuse without reserving it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};
use hyper::body::Incoming;

/// The gRPC message prefix: a compression flag and a 4-byte length.
const PREFIX: usize = 5;

/// Room a stream's buffer keeps between messages; a larger allocation (a
/// large message's) is let go with the message.
const KEEP: usize = 16 * 1024;

/// See the module documentation.
pub(super) struct WholeMessages {
    inner: Incoming,
    buf: BytesMut,
    max_message: usize,
}

impl WholeMessages {
    /// `inner`'s messages, whole; `max_message` is the decoder's bound.
    pub(super) fn new(inner: Incoming, max_message: usize) -> Self {
        Self {
            inner,
            buf: BytesMut::new(),
            max_message,
        }
    }

    /// The bytes of the buffer's first message when it is complete (or when
    /// its declared length is past the bound).
    fn ready(&mut self) -> Option<Bytes> {
        let header = self.buf.get(..PREFIX)?;
        let declared = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if declared > self.max_message {
            return Some(self.buf.split().freeze());
        }
        if self.buf.len() < PREFIX + declared {
            return None;
        }
        let message = self.buf.split_to(PREFIX + declared).freeze();
        if self.buf.capacity() > KEEP {
            // What is left (the start of the next message, if any) moves to
            // an allocation of its own: the message's goes with the message
            // once it is decoded, instead of staying with an idle stream.
            self.buf = BytesMut::from(&self.buf[..]);
        }
        Some(message)
    }
}

impl Body for WholeMessages {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        loop {
            if let Some(message) = self.ready() {
                return Poll::Ready(Some(Ok(Frame::data(message))));
            }
            match Pin::new(&mut self.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => self.buf.extend_from_slice(&data),
                    // Trailers: whatever came before them goes first (an
                    // incomplete message, which the decoder reports).
                    Err(frame) if self.buf.is_empty() => return Poll::Ready(Some(Ok(frame))),
                    Err(_) => return Poll::Ready(Some(Ok(Frame::data(self.buf.split().freeze())))),
                },
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) if self.buf.is_empty() => return Poll::Ready(None),
                // The body ended mid-message: the decoder says so.
                Poll::Ready(None) => {
                    return Poll::Ready(Some(Ok(Frame::data(self.buf.split().freeze()))));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.buf.is_empty() && self.inner.is_end_stream()
    }
}
