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

mod admin_listener;
mod background;
mod grpc;
#[cfg(feature = "test-util")]
mod in_process;
mod limits;
mod start;
mod tls;
mod whole;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::sync::watch;

use background::Background;

use crate::candidate::Candidate;
use crate::health::Health;
use crate::limiter::Limiter;
use crate::reload::Reloader;
use crate::rlqs::{Quotas, RlqsService};
use crate::rls::RlsService;
#[cfg(feature = "test-util")]
pub use in_process::InProcess;
pub(crate) use limits::ConnectionLimits;
pub(crate) use start::serve_from_settings;
pub(crate) use tls::{Tls, TlsFiles};

/// How often the TLS files are checked for a renewed certificate.
pub(crate) const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// How long shutdown waits for in-flight calls and open connections.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Says on stdout that `listener` listens on `addr`: `tollgate: admin
/// listening on 127.0.0.1:6070`, or with `--log-format json` one JSON object
/// shaped like the log's (`fields.message`, `fields.listener`, `fields.addr`).
fn announce(json: bool, listener: &str, addr: SocketAddr) {
    let message = format!("{listener} listening on {addr}");
    if json {
        let line = serde_json::json!({
            "timestamp": jiff::Timestamp::now().to_string(),
            "level": "INFO",
            "fields": {"message": message, "listener": listener, "addr": addr.to_string()},
            "target": "tollgate::server",
        });
        println!("{line}");
    } else {
        println!("tollgate: {message}");
    }
}

/// Binds `workers` listeners on `addr` with `SO_REUSEPORT`. With port 0 the
/// first gets a free port and the others share it.
///
/// A port some other process listens on is refused (`AddrInUse`), even when
/// that process is another Tollgate: `SO_REUSEPORT` would otherwise let the
/// two split the traffic, each counting its half of every limit in memory.
pub fn bind_grpc(addr: SocketAddr, workers: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    if addr.port() != 0 {
        ensure_port_free(addr)?;
    }
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

/// Fails with `AddrInUse` when a socket listens on `addr` already: a socket
/// bound without `SO_REUSEPORT` cannot share a port with a listener, whatever
/// options the listener set (`SO_REUSEADDR` lets it pass connections left in
/// TIME_WAIT by an earlier run).
fn ensure_port_free(addr: SocketAddr) -> std::io::Result<()> {
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    probe.set_reuse_address(true)?;
    probe.bind(&addr.into()).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AddrInUse {
            std::io::Error::new(
                e.kind(),
                "address already in use (another process, perhaps another tollgate, listens on it)",
            )
        } else {
            e
        }
    })
}

/// Everything `run` serves.
pub(crate) struct Serve {
    /// The limiter.
    pub limiter: Arc<Limiter>,
    /// The quota service (RLQS) over the same rules and store.
    pub quotas: Arc<Quotas>,
    /// Candidate rules evaluated beside the live ones, and their reloader.
    pub candidate: Option<CandidateRules>,
    /// Who is being limited (`None`: `--limited-clients 0`).
    pub limited: Option<Arc<crate::limited::Limited>>,
    /// gRPC listeners, one worker thread each (see [`bind_grpc`]).
    pub grpc: Vec<std::net::TcpListener>,
    /// Admin HTTP listeners.
    pub admin: Vec<std::net::TcpListener>,
    /// Hot reload, and how often to look for changes (`None`: SIGHUP only).
    pub reloader: Option<HotReload>,
    /// How long health checks fail before listeners close on shutdown.
    pub shutdown_delay: Duration,
    /// Bounds on connections and calls.
    pub limits: ConnectionLimits,
    /// TLS for gRPC and admin HTTP (`None`: plaintext).
    pub tls: Option<Arc<Tls>>,
    /// Whether the admin listeners use `tls` too.
    pub admin_tls: bool,
    /// Who may use the admin port from a browser.
    pub admin_access: Arc<crate::admin::Access>,
    /// `--log-format json`: the lines that say Tollgate is up are JSON too.
    pub log_json: bool,
    /// Rules from an xDS server (then `reloader` is `None`).
    pub xds: Option<crate::xds::XdsOptions>,
    /// statsd output of the reference's stats.
    pub statsd: Option<crate::stats::statsd::StatsdOptions>,
    /// The reference's stats as Prometheus metrics: the listener, the path
    /// and the mapping.
    pub reference_metrics: Option<ReferenceMetrics>,
    /// Tracing of ShouldRateLimit calls.
    pub otel: Option<Arc<crate::otel::Otel>>,
}

/// Candidate rules: the rule set evaluated beside the live one, and what
/// reloads it (with the live rules: on the same poll and SIGHUP).
pub(crate) struct CandidateRules {
    /// The candidate rules and their counters.
    pub candidate: Arc<Candidate>,
    /// Their reloader.
    pub reloader: Arc<Reloader>,
}

/// Hot reload of the live rules.
pub(crate) struct HotReload {
    /// The reloader.
    pub reloader: Arc<Reloader>,
    /// How often to look for changes (`None`: on SIGHUP only).
    pub interval: Option<Duration>,
}

/// The reference's stats served as Prometheus metrics.
pub(crate) struct ReferenceMetrics {
    /// Where.
    pub listener: std::net::TcpListener,
    /// On which path.
    pub path: String,
    /// Through which statsd-exporter mapping.
    pub mapper: Arc<crate::stats::mapper::Mapper>,
}

/// Serves until `shutdown` completes; then reports unhealthy for
/// `shutdown_delay`, stops accepting, lets in-flight calls finish (at most
/// [`DRAIN_TIMEOUT`]), and returns.
///
/// Each gRPC listener gets a worker thread with its own current-thread
/// runtime (see the module's comment); the admin side runs on one more.
pub(crate) fn run(
    serve: Serve,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (workers, control) = parts(serve, shutdown);
    let mut threads = Vec::with_capacity(workers.len());
    for (i, worker) in workers.into_iter().enumerate() {
        let thread = std::thread::Builder::new()
            .name(format!("tollgate-worker-{i}"))
            .spawn(move || -> std::io::Result<()> {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(worker)
            })?;
        threads.push(thread);
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Rule files and xDS pushes are loaded on this runtime's blocking
        // threads, recursing per level of descriptors: the main thread's
        // stack, not tokio's 2 MiB default (--max-rule-depth bounds the rest).
        .thread_stack_size(8 << 20)
        .build()?
        .block_on(control)?;
    for thread in threads {
        match thread.join() {
            Ok(result) => result?,
            Err(_) => return Err(std::io::Error::other("a worker thread panicked")),
        }
    }
    Ok(())
}

/// [`run`] on the runtime it is awaited on: the workers are tasks, not
/// threads. For tests that drive time by hand (a current-thread runtime
/// with its clock paused): every timer of the server is then on that clock.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub(crate) async fn run_here(
    serve: Serve,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (workers, control) = parts(serve, shutdown);
    let workers: Vec<_> = workers.into_iter().map(tokio::spawn).collect();
    control.await?;
    for worker in workers {
        worker
            .await
            .map_err(|_| std::io::Error::other("a worker task panicked"))??;
    }
    Ok(())
}

/// The server in pieces: one future per gRPC listener (a worker), and the
/// control future (admin listeners, background tasks, shutdown), which
/// returns once shutdown has told the workers to stop.
fn parts(
    serve: Serve,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> (
    Vec<impl Future<Output = std::io::Result<()>> + Send + 'static>,
    impl Future<Output = std::io::Result<()>> + Send + 'static,
) {
    let Serve {
        limiter,
        quotas,
        candidate,
        limited,
        grpc,
        admin,
        reloader,
        shutdown_delay,
        limits,
        tls,
        admin_tls,
        admin_access,
        log_json,
        xds,
        statsd,
        reference_metrics,
        otel,
    } = serve;
    // Before any worker answers: statsd's response time samples start with
    // the first call.
    if statsd.is_some() {
        limiter.metrics().response_samples.enable();
    }
    // Every decision, over gRPC or /json, is shown to the candidate rules
    // and to the view of who is limited.
    let mut observers: Vec<Arc<dyn crate::limiter::Observer>> = Vec::new();
    if let Some(c) = &candidate {
        observers.push(c.candidate.clone());
    }
    if let Some(l) = &limited {
        observers.push(l.clone());
    }
    limiter.set_observers(observers);
    let grpc_addr = grpc.first().and_then(|l| l.local_addr().ok());
    let admin_addrs: Vec<SocketAddr> = admin.iter().filter_map(|l| l.local_addr().ok()).collect();
    let reference_addr = reference_metrics
        .as_ref()
        .and_then(|r| r.listener.local_addr().ok());
    let (stop_tx, stop_rx) = watch::channel(false);
    let (grpc_health, health_service) = tonic_health::server::health_reporter();
    let health = Arc::new(Health::default());

    let mut workers = Vec::with_capacity(grpc.len());
    for listener in grpc {
        let service = RlsService::new(limiter.clone())
            .with_tracing(otel.clone())
            .into_server();
        let rlqs_message_bytes = limiter.options().bounds.request_bytes;
        let quota_service = RlqsService::new(quotas.clone()).into_server(rlqs_message_bytes);
        let limits = limits.clone();
        let tls = tls.clone();
        let health_service = health_service.clone();
        let stop = stop_rx.clone();
        workers.push(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let dispatch = grpc::Dispatch {
                rls: service,
                rlqs: quota_service,
                health: health_service,
                rlqs_message_bytes,
            };
            grpc::serve(listener, dispatch, limits, tls, stop).await
        });
    }

    let control = async move {
        let mut tasks = Background::default();
        for listener in admin {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let router = crate::admin::router(
                crate::admin::Handles::of(&limiter),
                quotas.clone(),
                candidate.as_ref().map(|c| c.candidate.clone()),
                limited.clone(),
                health.clone(),
                admin_access.clone(),
            );
            tasks.spawn(admin_listener::serve(
                listener,
                router,
                limits.clone(),
                tls.clone().filter(|_| admin_tls),
                stop_rx.clone(),
            ));
        }
        if let Some(reference) = reference_metrics {
            let listener = tokio::net::TcpListener::from_std(reference.listener)?;
            let router = crate::admin::reference_metrics_router(
                limiter.metrics().clone(),
                reference.path,
                reference.mapper,
            );
            tasks.spawn(admin_listener::serve(
                listener,
                router,
                limits.clone(),
                None,
                stop_rx.clone(),
            ));
        }
        tasks.sweep(
            limiter.clone(),
            candidate.as_ref().map(|c| c.candidate.limiter().clone()),
            limited.clone(),
        );
        if let Some(view) = &limited {
            tasks.publish_limited(view.clone(), limiter.clone());
        }
        tasks.reset_watch(limiter.clone());
        tasks.owed_releases(limiter.clone());
        tasks.quota_ticks(quotas.clone());
        if let Some(statsd) = statsd {
            tasks.spawn(crate::stats::statsd::run(statsd, limiter.metrics().clone()));
        }
        if let Some(xds) = xds {
            tasks.spawn(crate::xds::run(xds, limiter.clone(), health.clone()));
        }
        if let Some(tls) = tls.clone() {
            tasks.tls_renewal(tls);
        }
        // Serving before the lines that say Tollgate is up: a probe sent as
        // soon as they appear finds the service.
        grpc_health
            .set_service_status(LIVENESS_SERVICE, tonic_health::ServingStatus::Serving)
            .await;
        tasks.grpc_health(limiter.clone(), health.clone(), grpc_health.clone());
        if let Some(reloader) = reloader {
            tasks.rule_reloads(reloader, candidate.as_ref().map(|c| c.reloader.clone()));
        }
        tasks.admin_tokens(admin_access.clone());
        // Signal handlers are in place (SIGHUP above; SIGTERM/SIGINT on the
        // first poll of `shutdown`) before the lines that say Tollgate is up:
        // a signal sent as soon as they appear is handled, not fatal.
        let mut shutdown = std::pin::pin!(shutdown);
        let early = futures_util::poll!(shutdown.as_mut()).is_ready();
        // Lines on stdout that scripts and tests can wait for.
        if let Some(a) = reference_addr {
            announce(log_json, "reference metrics", a);
        }
        for a in &admin_addrs {
            announce(log_json, "admin", *a);
        }
        if let Some(addr) = grpc_addr {
            announce(log_json, "gRPC", addr);
        }
        if !early {
            shutdown.await;
        }
        tracing::info!(delay = ?shutdown_delay, "shutting down: reporting unhealthy, then finishing calls in flight");
        health.start_draining();
        set_health(&grpc_health, tonic_health::ServingStatus::NotServing).await;
        tokio::time::sleep(shutdown_delay).await;
        let _ = stop_tx.send(true);
        tasks.abort();
        Ok::<(), std::io::Error>(())
    };
    (workers, control)
}

/// The gRPC health service name that is SERVING for as long as the process
/// serves gRPC, whatever the store or a drain: what a liveness probe asks.
pub const LIVENESS_SERVICE: &str = "liveness";

async fn set_health(
    reporter: &tonic_health::server::HealthReporter,
    status: tonic_health::ServingStatus,
) {
    reporter.set_service_status("", status).await;
    reporter
        .set_service_status("envoy.service.ratelimit.v3.RateLimitService", status)
        .await;
}

/// Completes on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
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
