//! The process around the limiter: listeners, worker runtimes, health,
//! background sweeping and graceful shutdown.
//!
//! Each worker thread runs its own current-thread Tokio runtime with its own
//! `SO_REUSEPORT` listener on the same address; the kernel spreads
//! connections across them. A request is then served start to finish on one
//! core with no cross-thread wake-ups, which is what makes a small request
//! path fast (a multi-thread runtime squeezed onto the same cores is markedly
//! slower). The limiter and store are shared.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use crate::limiter::Limiter;
use crate::rls::RlsService;

/// How long shutdown waits for in-flight calls and open connections.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds `workers` listeners on `addr` with `SO_REUSEPORT`. With port 0 the
/// first gets a free port and the others share it.
pub fn bind_grpc(addr: SocketAddr, workers: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut listeners = Vec::with_capacity(workers.max(1));
    let mut addr = addr;
    for _ in 0..workers.max(1) {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        socket.bind(&addr.into())?;
        socket.listen(1024)?;
        let listener: std::net::TcpListener = socket.into();
        addr = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// Serves gRPC on `listeners` (one worker thread each) until `shutdown`
/// completes, then stops accepting, lets in-flight calls finish, and returns.
pub fn run(
    limiter: Arc<Limiter>,
    listeners: Vec<std::net::TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (health, health_service) = tonic_health::server::health_reporter();
    control.block_on(async {
        health
            .set_serving::<envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<RlsService>>()
            .await;
        health.set_service_status("", tonic_health::ServingStatus::Serving).await;
    });

    let mut workers = Vec::with_capacity(listeners.len());
    for (i, listener) in listeners.into_iter().enumerate() {
        let service = RlsService::new(limiter.clone()).into_server();
        let health_service = health_service.clone();
        let mut stop = stop_rx.clone();
        let thread = std::thread::Builder::new()
            .name(format!("tollgate-worker-{i}"))
            .spawn(move || -> std::io::Result<()> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                    let mut drain = stop.clone();
                    let serve = tonic::transport::Server::builder()
                        .add_service(service)
                        .add_service(health_service)
                        .serve_with_incoming_shutdown(incoming, async move {
                            let _ = stop.wait_for(|s| *s).await;
                        });
                    // In-flight calls get `DRAIN_TIMEOUT` to finish; a client
                    // that keeps an idle connection open must not hold the
                    // process forever.
                    tokio::select! {
                        served = serve => served.map_err(std::io::Error::other),
                        _ = async {
                            let _ = drain.wait_for(|s| *s).await;
                            tokio::time::sleep(DRAIN_TIMEOUT).await;
                        } => Ok(()),
                    }
                })
            })?;
        workers.push(thread);
    }

    control.block_on(async {
        // State that can no longer matter is dropped every second, so memory
        // follows the active keys.
        let sweeper = {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    let now = limiter.clock().now();
                    limiter.store().sweep(now);
                }
            })
        };
        shutdown.await;
        tracing::info!("shutting down: no new calls, finishing the ones in flight");
        health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
        health
            .set_not_serving::<envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<RlsService>>()
            .await;
        let _ = stop_tx.send(true);
        sweeper.abort();
    });
    for worker in workers {
        match worker.join() {
            Ok(result) => result?,
            Err(_) => return Err(std::io::Error::other("a worker thread panicked")),
        }
    }
    Ok(())
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(e) => {
                    tracing::warn!("cannot listen for SIGTERM: {e}");
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
