//! The admin HTTP listener: HTTP/1.1 with a bound on connections and on how
//! long each may stay open (slow headers, a body that never ends, a reader
//! that never reads), so a slow client cannot lock out health checks.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::limits::{Acceptor, ConnectionLimits};
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
    let mut incoming = Acceptor::new(
        "admin",
        "--max-admin-connections",
        limits.admin_connections.clone(),
    );
    loop {
        tokio::select! {
            (tcp, permit) = incoming.next(&listener) => {
                let service = TowerToHyperService::new(router.clone());
                let lifetime = limits.admin_timeout;
                let acceptor = tls.as_ref().map(|t| t.admin_acceptor());
                let http1 = http1.clone();
                connections.spawn(async move {
                    let _permit = permit;
                    // Past its lifetime (TLS handshake included) the
                    // connection is simply dropped: whatever it was waiting
                    // for, it has had its time.
                    let _ = tokio::time::timeout(lifetime, async move {
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
                    })
                    .await;
                });
            }
            _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.abort_all();
}
