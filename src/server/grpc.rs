//! The gRPC server of one worker: HTTP/2 straight on hyper, dispatching by
//! path to the RateLimitService or the health service.
//!
//! tonic's own server puts a router (axum) and several tower layers in front
//! of every call; for one unary method and a health check a match on the path
//! does the same job for less.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::future::Either;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower_service::Service;

use super::DRAIN_TIMEOUT;

type Reply = http::Response<tonic::body::Body>;
type BoxReply = Pin<Box<dyn Future<Output = Result<Reply, Infallible>> + Send>>;

/// Routes a request to the rate limit service or the health service.
#[derive(Clone)]
pub(super) struct Dispatch<R, H> {
    pub(super) rls: R,
    pub(super) health: H,
}

impl<R, H> Service<http::Request<Incoming>> for Dispatch<R, H>
where
    R: Service<http::Request<Incoming>, Response = Reply, Error = Infallible, Future = BoxReply>,
    H: Service<http::Request<Incoming>, Response = Reply, Error = Infallible, Future = BoxReply>,
{
    type Response = Reply;
    type Error = Infallible;
    type Future = Either<BoxReply, BoxReply>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both services are always ready (tonic's generated servers are).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Incoming>) -> Self::Future {
        if request.uri().path().starts_with("/grpc.health.v1.Health/") {
            Either::Right(self.health.call(request))
        } else {
            // Everything else, unknown methods included (answered UNIMPLEMENTED).
            Either::Left(self.rls.call(request))
        }
    }
}

/// Accepts connections on `listener` until `stop` turns true, then closes
/// them gracefully, giving calls in flight up to [`DRAIN_TIMEOUT`].
pub(super) async fn serve<S>(
    listener: tokio::net::TcpListener,
    service: S,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()>
where
    S: Service<http::Request<Incoming>, Response = Reply, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut http2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // gRPC has no use for a Date header on every response.
    http2.auto_date_header(false);
    let mut connections = JoinSet::new();
    // Each connection watches its own copy of the stop signal.
    let stop_for_connections = stop.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, _) = match accepted {
                    Ok(accepted) => accepted,
                    // Out of file descriptors and the like: keep serving the others.
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let service = TowerToHyperService::new(service.clone());
                let mut stop = stop_for_connections.clone();
                let http2 = http2.clone();
                connections.spawn(async move {
                    let conn = http2.serve_connection(TokioIo::new(tcp), service);
                    let mut conn = std::pin::pin!(conn);
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        _ = async { let _ = stop.wait_for(|s| *s).await; } => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                });
            }
            _ = stop.wait_for(|s| *s) => break,
            // Reap finished connections as we go.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}
