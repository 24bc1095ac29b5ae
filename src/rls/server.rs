//! The ShouldRateLimit method on HTTP/2, with the checks tonic's generated
//! server leaves out: a non-gRPC content type is refused (HTTP 415, as the
//! gRPC spec asks), a message above the size bound is refused before it is
//! decoded, and a message that does not decode is the client's error
//! (INVALID_ARGUMENT with the reason), not the server's (INTERNAL).

use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::{Request, Response, Status};

use super::RlsService;

type Reply = http::Response<tonic::body::Body>;
type BoxReply = Pin<Box<dyn Future<Output = Result<Reply, Infallible>> + Send>>;

/// The full gRPC path of ShouldRateLimit.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The RateLimitService as an HTTP service.
#[derive(Debug, Clone)]
pub struct RlsServer {
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
        let method = Method(self.service.clone());
        let max = self.max_request_bytes;
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(RlsCodec).apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(method, request).await)
        })
    }
}

struct Method(Arc<RlsService>);

impl tonic::server::UnaryService<RateLimitRequest> for Method {
    type Response = RateLimitResponse;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RateLimitResponse>, Status>> + Send>>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.should_rate_limit(request).await })
    }
}

/// Prost encoding; decoding that calls an undecodable message invalid.
struct RlsCodec;

impl Codec for RlsCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = tonic_prost::ProstEncoder<RateLimitResponse>;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(Default::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(PhantomData)
    }
}

struct RequestDecoder(PhantomData<RateLimitRequest>);

impl Decoder for RequestDecoder {
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<RateLimitRequest>, Status> {
        RateLimitRequest::decode(buf).map(Some).map_err(|e| {
            Status::invalid_argument(format!("request is not a RateLimitRequest: {e}"))
        })
    }
}
