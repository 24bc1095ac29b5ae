//! The rule in vendor/h2's third patch (`check_headers` walks the fields
//! once instead of looking up five names): what HTTP/2 forbids in a
//! message Tollgate sends is still refused, what it allows still goes. Seen
//! through trailers, which hyper hands to h2 as they are (it strips the
//! forbidden names from headers before h2 sees them).

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::protocol::{Frame as Read, next_frame};

/// What the sender did after the answer's data.
#[derive(Debug, PartialEq)]
enum End {
    /// Sent the trailers (a HEADERS frame ending the stream).
    Trailers,
    /// Reset the stream instead.
    Reset,
}

/// Serves one HTTP/2 connection whose every answer ends with `trailers`,
/// calls it once with a client that checks nothing (frames read raw, so
/// only the sender's rule decides), and says how the answer ended.
async fn answer_ending_with(trailers: &[(&'static str, &'static str)]) -> End {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let sent: Vec<(&'static str, &'static str)> = trailers.to_vec();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        let service = hyper::service::service_fn(move |_request| {
            let mut map = http::HeaderMap::new();
            for (name, value) in &sent {
                map.append(*name, http::HeaderValue::from_static(value));
            }
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                Ok(Frame::data(Bytes::from_static(b"answer"))),
                Ok(Frame::trailers(map)),
            ];
            let body = StreamBody::new(futures_util::stream::iter(frames));
            async move { Ok::<_, Infallible>(http::Response::new(body)) }
        });
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(tcp), service)
            .await;
    });
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // Preface, empty SETTINGS, then GET / on stream 1 (literal fields,
    // no Huffman), ending the stream.
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "x"),
        (":path", "/"),
    ] {
        block.push(0);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    out.extend_from_slice(&(block.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[0x1, 0x1 | 0x4, 0, 0, 0, 1]);
    out.extend_from_slice(&block);
    tcp.write_all(&out).await.expect("write");
    let mut buf = Vec::new();
    let mut data_seen = false;
    let read = async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = tcp.read(&mut chunk).await.expect("read");
            assert!(n > 0, "the server closed before stream 1 ended");
            buf.extend_from_slice(&chunk[..n]);
            while let Some(Read {
                kind,
                flags,
                stream,
                ..
            }) = next_frame(&mut buf)
            {
                match (stream, kind) {
                    (1, 0x0) => data_seen = true,
                    (1, 0x1) if data_seen && flags & 0x1 != 0 => return End::Trailers,
                    (1, 0x3) => return End::Reset,
                    _ => {}
                }
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), read)
        .await
        .expect("stream 1 ended within 5 s")
}

#[tokio::test]
async fn trailers_http2_allows_are_sent() {
    for allowed in [
        &[("grpc-status", "0")][..],
        &[("grpc-status", "0"), ("te", "trailers")],
        // The first `te` decides, as a lookup of it did.
        &[("te", "trailers"), ("te", "gzip")],
    ] {
        assert_eq!(
            answer_ending_with(allowed).await,
            End::Trailers,
            "{allowed:?}"
        );
    }
}

#[tokio::test]
async fn trailers_http2_forbids_are_refused() {
    for forbidden in [
        ("connection", "close"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "websocket"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("te", "gzip"),
    ] {
        let end = answer_ending_with(&[("grpc-status", "0"), forbidden]).await;
        assert_eq!(end, End::Reset, "{forbidden:?}");
    }
}
