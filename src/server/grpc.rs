//! The gRPC server of one worker: HTTP/2 straight on hyper, dispatching by
//! path to the RateLimitService or the health service.
//!
//! tonic's own server puts a router (axum) and several tower layers in front
//! of every call; for one unary method and a health check a match on the path
//! does the same job for less.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::Either;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower_service::Service;

use super::DRAIN_TIMEOUT;
use super::limits::{Acceptor, ConnectionLimits};
use super::tls::Tls;
use super::whole::WholeMessages;

type Reply = http::Response<tonic::body::Body>;
type BoxReply = Pin<Box<dyn Future<Output = Result<Reply, Infallible>> + Send>>;

/// Routes a request to the rate limit service, the quota service or the
/// health service.
#[derive(Clone)]
pub(super) struct Dispatch<R, Q, H> {
    pub(super) rls: R,
    pub(super) rlqs: Q,
    pub(super) health: H,
    /// The largest quota service message (its bodies pass whole messages).
    pub(super) rlqs_message_bytes: usize,
}

impl<R, Q, H> Service<http::Request<Incoming>> for Dispatch<R, Q, H>
where
    R: Service<http::Request<Incoming>, Response = Reply, Error = Infallible, Future = BoxReply>,
    Q: Service<
            http::Request<WholeMessages>,
            Response = Reply,
            Error = Infallible,
            Future = BoxReply,
        >,
    H: Service<http::Request<Incoming>, Response = Reply, Error = Infallible, Future = BoxReply>,
{
    type Response = Reply;
    type Error = Infallible;
    type Future = Either<BoxReply, BoxReply>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Every service is always ready (tonic's generated servers are).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Incoming>) -> Self::Future {
        let path = request.uri().path();
        if path.starts_with("/grpc.health.v1.Health/") {
            Either::Right(self.health.call(request))
        } else if path.starts_with(crate::rlqs::SERVICE_PATH) {
            let max = self.rlqs_message_bytes;
            Either::Right(
                self.rlqs
                    .call(request.map(|body| WholeMessages::new(body, max))),
            )
        } else {
            // Everything else, unknown methods included (answered UNIMPLEMENTED).
            Either::Left(self.rls.call(request))
        }
    }
}

/// What a response body holds until hyper has sent it and dropped the body:
/// a streaming call's [`CallGuard`] (a stream is a call in flight until its
/// body ends), a unary answer's [`Unsent`].
enum Held {
    Call(#[allow(dead_code)] CallGuard),
    Answer(#[allow(dead_code)] Unsent),
}

/// A response body with what it holds; inline, not boxed (an allocation and
/// an indirect call per frame showed on the one-key benchmark).
struct Marked {
    body: tonic::body::Body,
    _held: Held,
}

impl http_body::Body for Marked {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A response as a connection's service answers it.
type MarkedReply = http::Response<Marked>;

/// How long an idle connection being closed has to finish closing.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What one connection is doing, for the idle timeout. Calls only count
/// (no clock reads on the request path); the connection's own tick turns
/// "no call in flight and none finished since the last tick" into idle time.
#[derive(Default)]
struct Activity {
    in_flight: AtomicUsize,
    /// Calls finished so far.
    finished: AtomicU64,
    /// The current period of `--request-timeout` (the connection's second
    /// tick counts them), and per period (mod 3) the unary answers started
    /// in it and not yet sent: an answer still unsent two periods on has a
    /// client that does not read it.
    period: AtomicU64,
    unsent: [AtomicU64; 3],
}

impl Activity {
    /// Whether any call has started.
    fn called(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) > 0 || self.finished.load(Ordering::Relaxed) > 0
    }

    /// A mark that changes whenever a call starts or ends; `None` while a
    /// call is in flight.
    fn mark(&self) -> Option<u64> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        Some(self.finished.load(Ordering::Relaxed))
    }
}

/// Ends a call's activity, also when the call is dropped (a reset stream).
struct CallGuard(Arc<Activity>);

impl CallGuard {
    /// The call is over and its answer is ready: from now on the answer is
    /// unsent until hyper has sent it.
    fn answered(self) -> Unsent {
        let activity = self.0.clone();
        drop(self);
        Unsent::new(activity)
    }
}

/// A unary answer not yet sent (hyper drops the body once it is): counted
/// in its period, see [`Activity::unsent`].
struct Unsent {
    activity: Arc<Activity>,
    slot: usize,
}

impl Unsent {
    fn new(activity: Arc<Activity>) -> Self {
        let slot = (activity.period.load(Ordering::Relaxed) % 3) as usize;
        activity.unsent[slot].fetch_add(1, Ordering::Relaxed);
        Self { activity, slot }
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        self.activity.unsent[self.slot].fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection's service: bounds each call's time and records activity.
#[derive(Clone)]
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    request_timeout: Duration,
}

impl<S> Service<http::Request<Incoming>> for Tracked<S>
where
    S: Service<http::Request<Incoming>, Response = Reply, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = MarkedReply;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<MarkedReply, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Incoming>) -> Self::Future {
        self.activity.in_flight.fetch_add(1, Ordering::Relaxed);
        let guard = CallGuard(self.activity.clone());
        // A quota stream (and a health watch) lasts as long as the client
        // keeps it: the request timeout bounds its start only, and the call
        // lasts while its body does.
        let path = request.uri().path();
        let streaming =
            path.starts_with(crate::rlqs::SERVICE_PATH) || path == "/grpc.health.v1.Health/Watch";
        let call = self.inner.call(request);
        let timeout = self.request_timeout;
        Box::pin(async move {
            let mut call = std::pin::pin!(call);
            // Most calls (the memory store's) finish on their first poll:
            // they never need a timer.
            let reply = match futures_util::poll!(call.as_mut()) {
                Poll::Ready(reply) => reply,
                Poll::Pending => match tokio::time::timeout(timeout, call).await {
                    Ok(reply) => reply,
                    // A stream whose body never ends (or a store that never
                    // answers) cannot hold the call past the bound.
                    Err(_) => Ok(tonic::Status::deadline_exceeded(format!(
                        "call took longer than {timeout:?} (--request-timeout)"
                    ))
                    .into_http()),
                },
            };
            let Ok(reply) = reply;
            let held = if streaming {
                Held::Call(guard)
            } else {
                // Sent or not, the answer must leave within the bound too:
                // a client that never reads it (a zero window) would hold
                // the stream forever (see `drive`).
                Held::Answer(guard.answered())
            };
            Ok(reply.map(|body| Marked { body, _held: held }))
        })
    }
}

/// Waits until the connection has sent the 24-byte HTTP/2 preface, at most
/// `within`; false when it did not (or closed).
async fn preface(tcp: &tokio::net::TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 24];
    loop {
        match tokio::time::timeout_at(deadline, tcp.peek(&mut buf)).await {
            Ok(Ok(n)) if n >= buf.len() => return true,
            Ok(Ok(0) | Err(_)) | Err(_) => return false,
            // Part of it: peek returns at once while data waits, so pause.
            Ok(Ok(_)) => {
                let pause = tokio::time::sleep(Duration::from_millis(5));
                if tokio::time::timeout_at(deadline, pause).await.is_err() {
                    return false;
                }
            }
        }
    }
}

/// Accepts connections on `listener` until `stop` turns true, then closes
/// them gracefully, giving calls in flight up to [`DRAIN_TIMEOUT`].
pub(super) async fn serve<S>(
    listener: tokio::net::TcpListener,
    service: S,
    limits: ConnectionLimits,
    tls: Option<Arc<Tls>>,
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
    // Flow-control windows of about one request: a client cannot make a
    // connection buffer much more than the largest request it may send.
    let window = u32::try_from(limits.window_bytes.max(65_535)).unwrap_or(i32::MAX as u32);
    http2
        // gRPC has no use for a Date header on every response.
        .auto_date_header(false)
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.keepalive)
        .keep_alive_timeout(limits.keepalive.unwrap_or(Duration::from_secs(20)))
        .max_concurrent_streams(limits.max_streams)
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .max_send_buf_size(64 * 1024)
        .max_header_list_size(16 * 1024);
    let mut connections = JoinSet::new();
    // Each connection watches its own copy of the stop signal.
    let stop_for_connections = stop.clone();
    let mut incoming = Acceptor::new(
        "gRPC",
        "--max-connections",
        limits.grpc_connections.clone(),
        limits.open.grpc.clone(),
    );
    loop {
        tokio::select! {
            (tcp, permit) = incoming.next(&listener) => {
                let _ = tcp.set_nodelay(true);
                let activity = Arc::new(Activity::default());
                let service = TowerToHyperService::new(Tracked {
                    inner: service.clone(),
                    activity: activity.clone(),
                    request_timeout: limits.request_timeout,
                });
                let stop = stop_for_connections.clone();
                let http2 = http2.clone();
                let handshake = limits.handshake_timeout;
                let idle = limits.idle_timeout;
                let request_timeout = limits.request_timeout;
                let acceptor = tls.as_ref().map(|t| t.grpc_acceptor());
                // In a server connection: the HTTP/2 library's refusals here
                // are calls refused (its client errors, xDS's and OTLP's, are not).
                connections.spawn(crate::logging::in_server_connection(async move {
                    let _permit = permit;
                    match acceptor {
                        None => {
                            if preface(&tcp, handshake).await {
                                let io = TokioIo::new(tcp);
                                drive(http2.serve_connection(io, service), &activity, idle, request_timeout, None, stop).await;
                            }
                        }
                        Some(acceptor) => {
                            // The handshake timeout covers the TLS handshake,
                            // and the first call must follow within it too
                            // (the preface cannot be peeked through TLS).
                            let started = tokio::time::Instant::now();
                            if let Ok(Ok(stream)) = tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
                                let io = TokioIo::new(stream);
                                let first_call_by = Some(started + handshake);
                                drive(http2.serve_connection(io, service), &activity, idle, request_timeout, first_call_by, stop).await;
                            }
                        }
                    }
                }));
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

/// Serves one connection until it ends: closes it gracefully when `stop`
/// turns true, when no call has been in flight for `idle`, when no call
/// started by `first_call_by`, or when an answer is still unsent two
/// periods of `request_timeout` after it was ready (a client that does not
/// read); a peer that does not finish closing within the grace is dropped.
async fn drive<C>(
    conn: C,
    activity: &Activity,
    idle: Duration,
    request_timeout: Duration,
    first_call_by: Option<tokio::time::Instant>,
    mut stop: watch::Receiver<bool>,
) where
    C: Future + GracefulConnection,
{
    let mut conn = std::pin::pin!(conn);
    let mut tick = tokio::time::interval((idle / 4).max(Duration::from_millis(50)));
    // The activity mark at the last tick, and since when it has not moved.
    let mut last_mark = None;
    let mut quiet_since = tokio::time::Instant::now();
    // Once closing, how long the peer has to finish (a graceful close waits
    // for the peer's PING ack too, which a hostile peer never sends).
    let mut closing: Option<tokio::time::Instant> = None;
    let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
    let first_call_by = first_call_by.unwrap_or(far);
    let mut periods = tokio::time::interval(request_timeout);
    periods.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            _ = periods.tick(), if closing.is_none() => {
                // Answers of two periods ago are at least one whole period
                // old; their slot takes the next period's.
                let period = activity.period.load(Ordering::Relaxed) + 1;
                let oldest = ((period + 1) % 3) as usize;
                if activity.unsent[oldest].load(Ordering::Relaxed) > 0 {
                    tracing::debug!("an answer unsent past --request-timeout (the client does not read): closing its connection");
                    closing = Some(tokio::time::Instant::now() + IDLE_CLOSE_GRACE);
                    conn.as_mut().shut_down();
                }
                activity.period.store(period, Ordering::Relaxed);
            }
            _ = stop.wait_for(|s| *s), if closing.is_none() => {
                closing = Some(tokio::time::Instant::now() + DRAIN_TIMEOUT);
                conn.as_mut().shut_down();
            }
            now = tick.tick(), if closing.is_none() => {
                let mark = activity.mark();
                if mark.is_none() || mark != last_mark {
                    last_mark = mark;
                    quiet_since = now;
                } else if now - quiet_since >= idle {
                    closing = Some(tokio::time::Instant::now() + IDLE_CLOSE_GRACE);
                    conn.as_mut().shut_down();
                }
            }
            _ = tokio::time::sleep_until(first_call_by), if closing.is_none() && !activity.called() => {
                closing = Some(tokio::time::Instant::now() + IDLE_CLOSE_GRACE);
                conn.as_mut().shut_down();
            }
            _ = tokio::time::sleep_until(closing.unwrap_or(far)), if closing.is_some() => break,
        }
    }
}

/// hyper's HTTP/2 connection, whatever its transport.
trait GracefulConnection {
    fn shut_down(self: Pin<&mut Self>);
}

impl<I, S, E> GracefulConnection for hyper::server::conn::http2::Connection<I, S, E>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S: hyper::service::HttpService<Incoming>,
    S::ResBody: 'static,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
    <S::ResBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn shut_down(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}
