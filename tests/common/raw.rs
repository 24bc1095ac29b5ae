//! Raw gRPC calls to ShouldRateLimit over HTTP/2: any body, any bytes in
//! the request's text (which a generated client, holding `String`s, cannot
//! send), any content type.

use std::net::SocketAddr;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};

pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// A raw gRPC call: one HTTP/2 request with `content_type` and `body` (then,
/// when `hold` is set, a body that never ends). Returns the HTTP status and
/// the grpc-status (from headers or trailers).
pub async fn raw_call(
    addr: SocketAddr,
    content_type: &str,
    body: Vec<u8>,
    hold: bool,
) -> (u16, Option<String>) {
    let (status, grpc, _) = raw_call_answer(addr, content_type, body, hold).await;
    (status, grpc)
}

/// [`raw_call`], with the answer's message when there is one.
pub async fn raw_call_answer(
    addr: SocketAddr,
    content_type: &str,
    body: Vec<u8>,
    hold: bool,
) -> (u16, Option<String>, Option<RateLimitResponse>) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let first = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(Frame::data(
        Bytes::from(body),
    ))]);
    let stream: std::pin::Pin<Box<dyn futures_util::Stream<Item = _> + Send>> = if hold {
        Box::pin(futures_util::StreamExt::chain(
            first,
            futures_util::stream::pending(),
        ))
    } else {
        Box::pin(first)
    };
    let request = http::Request::post(format!("http://{addr}{PATH}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(StreamBody::new(stream))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let from_headers = response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap_or("").to_owned());
    let collected = response.into_body().collect().await.expect("body");
    let from_trailers = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .map(|v| v.to_str().unwrap_or("").to_owned());
    let data = collected.to_bytes();
    let answer = (data.len() >= 5)
        .then(|| <RateLimitResponse as prost::Message>::decode(&data[5..]).ok())
        .flatten();
    (status, from_headers.or(from_trailers), answer)
}

/// A gRPC frame: uncompressed, with its length.
pub fn frame(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A varint, as protobuf writes it.
pub fn varint(out: &mut Vec<u8>, mut v: usize) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (a string, bytes or a message) of any bytes.
pub fn bytes_field(out: &mut Vec<u8>, field: u8, value: &[u8]) {
    out.push(field << 3 | 2);
    varint(out, value.len());
    out.extend_from_slice(value);
}

/// A `RateLimitRequest` whose domain, keys and values are any bytes.
pub fn request_bytes(domain: &[u8], descriptors: &[&[(&[u8], &[u8])]]) -> Vec<u8> {
    let mut out = Vec::new();
    bytes_field(&mut out, 1, domain);
    for entries in descriptors {
        let mut descriptor = Vec::new();
        for (key, value) in *entries {
            let mut entry = Vec::new();
            bytes_field(&mut entry, 1, key);
            bytes_field(&mut entry, 2, value);
            bytes_field(&mut descriptor, 1, &entry);
        }
        bytes_field(&mut out, 2, &descriptor);
    }
    out
}

/// One ShouldRateLimit call of [`request_bytes`] that must be answered.
pub async fn ask_bytes(
    addr: SocketAddr,
    domain: &[u8],
    descriptors: &[&[(&[u8], &[u8])]],
) -> RateLimitResponse {
    let body = frame(&request_bytes(domain, descriptors));
    let (status, grpc, answer) = raw_call_answer(addr, "application/grpc", body, false).await;
    assert_eq!((status, grpc.as_deref()), (200, Some("0")), "answered");
    answer.expect("a RateLimitResponse")
}
