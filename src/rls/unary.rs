//! The ShouldRateLimit method on HTTP/2, unary gRPC done directly: read the
//! one length-prefixed message (refused above the size bound before it is
//! decoded), decode it (a message that does not decode is the client's
//! error: INVALID_ARGUMENT with the reason, not INTERNAL), decide, and answer
//! with one data frame and `grpc-status` in the trailers. A non-gRPC content
//! type is refused (HTTP 415, as the gRPC spec asks); compressed messages
//! are refused (UNIMPLEMENTED: Envoy does not compress these calls).
//!
//! tonic's generated server does the same through its codec, buffers and
//! streaming body on every call; a unary call needs none of it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Status;

use super::{RlsService, wire};
use crate::limiter::Decision;

type Reply = http::Response<tonic::body::Body>;
type BoxReply = Pin<Box<dyn Future<Output = Result<Reply, Infallible>> + Send>>;

/// The full gRPC path of ShouldRateLimit.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The RateLimitService as an HTTP service.
#[derive(Debug, Clone)]
pub(crate) struct RlsServer {
    service: Arc<RlsService>,
    max_request_bytes: usize,
}

impl RlsServer {
    pub(super) fn new(service: RlsService, max_request_bytes: usize) -> Self {
        Self {
            service: Arc::new(service),
            max_request_bytes,
        }
    }
}

/// A reply with a gRPC status and no message (trailers-only).
fn status_reply(status: &Status) -> Reply {
    status.clone().into_http()
}

impl<B> tower_service::Service<http::Request<B>> for RlsServer
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    type Response = Reply;
    type Error = Infallible;
    type Future = BoxReply;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> BoxReply {
        let grpc_content = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        if !grpc_content {
            return Box::pin(async {
                let mut reply = http::Response::new(tonic::body::Body::default());
                *reply.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
                Ok(reply)
            });
        }
        if request.uri().path() != SHOULD_RATE_LIMIT {
            let path = request.uri().path().to_owned();
            return Box::pin(async move {
                Ok(status_reply(&Status::unimplemented(format!(
                    "unknown method {path}"
                ))))
            });
        }
        // The caller's request and trace ids, for the refusal log.
        let ids = crate::logging::CallIds::from_headers(request.headers());
        let answer = self.answer(request);
        match ids {
            Some(ids) => Box::pin(crate::logging::with_call_ids(ids, answer)),
            None => answer,
        }
    }
}

impl RlsServer {
    /// Answers a ShouldRateLimit call (its content type and path checked).
    fn answer<B>(&self, request: http::Request<B>) -> BoxReply
    where
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    {
        let service = self.service.clone();
        let max = self.max_request_bytes;
        if let Some(otel) = service.tracing().cloned() {
            let headers = request.headers().clone();
            return Box::pin(async move {
                let request = match read_request(request.into_body(), max).await {
                    Ok(request) => request,
                    Err(status) => return Ok(reply_of(service.undecided(None, status))),
                };
                Ok(
                    match service.traced_decision(&otel, &headers, &request).await {
                        Ok(decision) => ok_reply(&decision),
                        Err(status) => status_reply(&status),
                    },
                )
            });
        }
        Box::pin(async move {
            let request = match read_request(request.into_body(), max).await {
                Ok(request) => request,
                Err(status) => return Ok(reply_of(service.undecided(None, status))),
            };
            Ok(reply_of(service.decision(&request).await))
        })
    }
}

/// The call's RateLimitRequest, or the status to refuse it with.
async fn read_request<B>(body: B, max: usize) -> Result<RateLimitRequest, Status>
where
    B: http_body::Body<Data = bytes::Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let message = read_message(body, max).await?;
    super::decode::request(message)
        .map_err(|e| Status::invalid_argument(format!("request is not a RateLimitRequest: {e}")))
}

/// The one message of a unary call, without its 5-byte prefix; at most
/// `max` bytes (and the prefix) are ever buffered.
async fn read_message<B>(body: B, max: usize) -> Result<bytes::Bytes, Status>
where
    B: http_body::Body<Data = bytes::Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = std::pin::pin!(body);
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|e| Status::cancelled(format!("request body: {}", e.into())))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if buf.len() + data.len() > max.saturating_add(5) {
            return Err(too_large(buf.len() + data.len() - 5, max));
        }
        buf.extend_from_slice(&data);
    }
    let [flag, l0, l1, l2, l3, ..] = buf[..] else {
        return Err(Status::invalid_argument(
            "no request message (gRPC frame missing)",
        ));
    };
    if flag != 0 {
        return Err(Status::unimplemented(
            "compressed request messages are not accepted",
        ));
    }
    let len = u32::from_be_bytes([l0, l1, l2, l3]) as usize;
    if len > max {
        return Err(too_large(len, max));
    }
    if buf.len() != 5 + len {
        return Err(Status::invalid_argument(format!(
            "request body of {} bytes does not hold exactly one message of {len} bytes",
            buf.len()
        )));
    }
    Ok(buf.split_off(5).freeze())
}

fn too_large(bytes: usize, max: usize) -> Status {
    Status::resource_exhausted(format!(
        "request message of {bytes} bytes is above the bound of {max} (--max-request-bytes)"
    ))
}

/// The reply to a decision, or to the status that failed it.
fn reply_of(decided: Result<Decision, Status>) -> Reply {
    match decided {
        Ok(decision) => ok_reply(&decision),
        Err(status) => status_reply(&status),
    }
}

/// An answer: one data frame with the message, then `grpc-status: 0`.
fn ok_reply(decision: &Decision) -> Reply {
    let len = wire::encoded_len(decision);
    let mut frame = Vec::with_capacity(5 + len);
    frame.push(0);
    frame.extend_from_slice(&(len as u32).to_be_bytes());
    wire::encode(decision, &mut frame);
    let mut reply = http::Response::new(tonic::body::Body::new(UnaryBody::new(frame.into())));
    reply.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    reply
}

/// A unary gRPC response body: the framed message, then `grpc-status: 0`
/// in the trailers.
pub struct UnaryBody {
    message: Option<bytes::Bytes>,
    trailers: bool,
}

impl UnaryBody {
    /// A body for one framed message (the 5-byte prefix included).
    pub fn new(framed: bytes::Bytes) -> Self {
        Self {
            message: Some(framed),
            trailers: true,
        }
    }
}

impl http_body::Body for UnaryBody {
    type Data = bytes::Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Infallible>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(message))));
        }
        if std::mem::take(&mut self.trailers) {
            // The name made once: given as text it is parsed every answer.
            static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
            let mut trailers = http::HeaderMap::new();
            trailers.insert(&GRPC_STATUS, http::HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && !self.trailers
    }
}
