//! The ceiling for `loadtest/ceiling.sh`: a gRPC server on Tollgate's own
//! HTTP/2 stack (hyper, one current-thread runtime per worker on an
//! `SO_REUSEPORT` listener, the same HTTP/2 settings) that reads each
//! request and answers `ShouldRateLimit` with OK, deciding nothing. What
//! Tollgate does beyond this is the cost of deciding; the rest is the stack.
//!
//! usage: tollgate-ceiling [--addr HOST:PORT] [--workers N]

// A load tool run by hand: a setup that fails ends it with the reason.
#![allow(clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prost::Message;

/// A gRPC message frame holding an OK `RateLimitResponse`.
fn ok_frame() -> Bytes {
    let message = RateLimitResponse {
        overall_code: Code::Ok as i32,
        ..RateLimitResponse::default()
    }
    .encode_to_vec();
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    frame.into()
}

async fn answer(
    request: http::Request<Incoming>,
    ok: Bytes,
) -> Result<http::Response<tonic::body::Body>, Infallible> {
    // Read the request as a real server must, then answer.
    let mut body = request.into_body();
    while let Some(frame) =
        futures_util::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
    {
        if frame.is_err() {
            break;
        }
    }
    // The same response body as Tollgate's.
    let body = tollgate::UnaryBody::new(ok);
    Ok(http::Response::builder()
        .header("content-type", "application/grpc")
        .body(tonic::body::Body::new(body))
        .expect("a valid response"))
}

fn main() -> std::io::Result<()> {
    let mut addr: SocketAddr = "127.0.0.1:18181".parse().expect("address");
    let mut workers = 1usize;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_default();
        match flag.as_str() {
            "--addr" => addr = value.parse().map_err(std::io::Error::other)?,
            "--workers" => workers = value.parse().map_err(std::io::Error::other)?,
            other => return Err(std::io::Error::other(format!("unknown flag {other}"))),
        }
    }
    let listeners = tollgate::bind_grpc(addr, workers)?;
    println!(
        "tollgate-ceiling: listening on {}",
        listeners[0].local_addr()?
    );
    let ok = ok_frame();
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            let ok = ok.clone();
            std::thread::spawn(move || serve(listener, ok))
        })
        .collect();
    for thread in threads {
        thread
            .join()
            .map_err(|_| std::io::Error::other("worker panicked"))??;
    }
    Ok(())
}

fn serve(listener: std::net::TcpListener, ok: Bytes) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        // Tollgate's settings (src/server/grpc.rs) at their defaults.
        http2
            .auto_date_header(false)
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(Duration::from_secs(30)))
            .keep_alive_timeout(Duration::from_secs(30))
            .max_concurrent_streams(1024)
            .initial_stream_window_size(128 * 1024)
            .initial_connection_window_size(128 * 1024)
            .max_send_buf_size(64 * 1024)
            .max_header_list_size(16 * 1024);
        loop {
            let (tcp, _) = listener.accept().await?;
            let _ = tcp.set_nodelay(true);
            let http2 = http2.clone();
            let ok = ok.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |r| answer(r, ok.clone()));
                let _ = http2.serve_connection(TokioIo::new(tcp), service).await;
            });
        }
    })
}
