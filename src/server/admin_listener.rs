//! The admin HTTP listener: HTTP/1.1 with a bound on connections and on how
//! long each may stay open (slow headers, a body that never ends, a reader
//! that never reads), so a slow client cannot lock out health checks.
//!
//! At the bound, a new connection closes the one idle the longest (no
//! request in progress: never sent one, or between requests) instead of
//! being turned away: idle connections, however many are opened, cannot
//! keep a kubelet's probe out. Only when every connection is busy with a
//! request is a new one refused.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::limits::{Acceptor, ConnectionLimits, Gone, Idle};
use super::tls::Tls;

/// Serves `router` on `listener` until `stop` turns true.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    tls: Option<Arc<Tls>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.admin_timeout.min(Duration::from_secs(10)))
        .max_buf_size(64 * 1024);
    let mut connections = JoinSet::new();
    let idle = limits.admin_idle.clone();
    let evict = {
        let idle = idle.clone();
        move || idle.evict_oldest()
    };
    let mut incoming = Acceptor::new(
        "admin",
        "--max-admin-connections",
        limits.admin_connections.clone(),
        limits.open.admin.clone(),
    )
    .evicting(evict);
    loop {
        tokio::select! {
            (tcp, permit) = incoming.next(&listener) => {
                let (id, evicted) = idle.add();
                let service = TowerToHyperService::new(Tracked {
                    router: router.clone(),
                    idle: idle.clone(),
                    id,
                    peer: tcp.peer_addr().ok().map(crate::admin::Peer),
                });
                let lifetime = limits.admin_timeout;
                let acceptor = tls.as_ref().map(|t| t.admin_acceptor());
                let http1 = http1.clone();
                let idle = idle.clone();
                connections.spawn(async move {
                    let _permit = permit;
                    let _gone = Gone(&idle, id);
                    // Past its lifetime (TLS handshake included) the
                    // connection is simply dropped: whatever it was waiting
                    // for, it has had its time. Evicted, likewise.
                    let serve = tokio::time::timeout(lifetime, async move {
                        match acceptor {
                            None => {
                                let _ = http1.serve_connection(TokioIo::new(tcp), service).await;
                            }
                            Some(acceptor) => {
                                if let Ok(stream) = acceptor.accept(tcp).await {
                                    let _ = http1.serve_connection(TokioIo::new(stream), service).await;
                                }
                            }
                        }
                    });
                    tokio::select! {
                        _ = serve => {}
                        () = evicted.notified() => {}
                    }
                });
            }
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.abort_all();
}

/// The router, marking its connection busy while a request is in progress,
/// and giving each request its caller's address (for the audit log and
/// the throttle on failed tokens).
#[derive(Clone)]
struct Tracked {
    router: axum::Router,
    idle: Arc<Idle>,
    id: u64,
    peer: Option<crate::admin::Peer>,
}

impl tower_service::Service<axum::http::Request<hyper::body::Incoming>> for Tracked {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: axum::http::Request<hyper::body::Incoming>) -> Self::Future {
        self.idle.set(self.id, true);
        if let Some(peer) = self.peer {
            request.extensions_mut().insert(peer);
        }
        let mut router = self.router.clone();
        let idle = self.idle.clone();
        let id = self.id;
        Box::pin(async move {
            let response =
                tower_service::Service::call(&mut router, request.map(axum::body::Body::new)).await;
            idle.set(id, false);
            response
        })
    }
}
