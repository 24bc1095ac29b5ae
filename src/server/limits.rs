//! Bounds on what a client can hold: connections, idle time, stalled
//! handshakes and streams, buffers. Every bound is a flag (see docs/security.md's
//! "Bounds" table); the defaults leave Envoy's own behaviour untouched.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connection bounds for the gRPC and admin listeners.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionLimits {
    /// Open gRPC connections, all workers together (`--max-connections`).
    pub grpc_connections: Arc<Semaphore>,
    /// Time for a new connection to send the HTTP/2 preface (`--handshake-timeout`).
    pub handshake_timeout: Duration,
    /// A connection with no call in flight for this long is closed
    /// gracefully (`--idle-timeout`); Envoy reconnects on its next call.
    pub idle_timeout: Duration,
    /// HTTP/2 PING interval; a peer that does not answer within the same
    /// time is dropped (`--keepalive`; `None`: no pings).
    pub keepalive: Option<Duration>,
    /// Longest one call may take, reading its body included
    /// (`--request-timeout`); past it the call ends with DEADLINE_EXCEEDED.
    pub request_timeout: Duration,
    /// Concurrent streams per gRPC connection (`--max-streams`).
    pub max_streams: u32,
    /// HTTP/2 flow-control window (`--max-request-bytes`): a connection
    /// buffers about this much unread, and a request is no larger.
    pub window_bytes: usize,
    /// Open admin connections (`--max-admin-connections`).
    pub admin_connections: Arc<Semaphore>,
    /// Longest an admin connection stays open, headers, body and response
    /// included (`--admin-timeout`).
    pub admin_timeout: Duration,
    /// The admin connections and since when each is idle, across all admin
    /// listeners (they share `admin_connections`, so eviction does too).
    pub admin_idle: Arc<Idle>,
    /// Open connections, for `/metrics` (the limiter's).
    pub open: Arc<crate::metrics::Connections>,
}

impl ConnectionLimits {
    /// The bounds `args` set, counting open connections on `open`.
    pub(super) fn from_settings(
        args: &crate::settings::ServeArgs,
        open: &Arc<crate::metrics::Connections>,
    ) -> Self {
        Self {
            grpc_connections: Arc::new(Semaphore::new(args.max_connections)),
            handshake_timeout: args.handshake_timeout,
            idle_timeout: args.idle_timeout,
            keepalive: args.keepalive.0,
            request_timeout: args.request_timeout,
            max_streams: args.max_streams,
            window_bytes: args.max_request_bytes,
            admin_connections: Arc::new(Semaphore::new(args.max_admin_connections)),
            admin_timeout: args.admin_timeout,
            admin_idle: Self::admin_idle(open),
            open: open.clone(),
        }
    }

    /// The idle set of admin connections, counting its busy ones on
    /// `open`'s gauge.
    pub(super) fn admin_idle(open: &crate::metrics::Connections) -> Arc<Idle> {
        Arc::new(Idle::new(open.admin_busy.clone()))
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        let open = Arc::new(crate::metrics::Connections::default());
        Self {
            grpc_connections: Arc::new(Semaphore::new(10_000)),
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(3600),
            keepalive: Some(Duration::from_secs(30)),
            request_timeout: Duration::from_secs(5),
            max_streams: 1024,
            window_bytes: 128 * 1024,
            admin_connections: Arc::new(Semaphore::new(64)),
            admin_timeout: Duration::from_secs(30),
            admin_idle: Self::admin_idle(&open),
            open,
        }
    }
}

/// Backs off after failed accepts (out of file descriptors, say), so the
/// loop does not spin, and logs once per episode instead of once per failure.
#[derive(Debug, Default)]
struct AcceptBackoff {
    delay: Option<Duration>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MOST: Duration = Duration::from_secs(1);

    /// An accept failed: logs the first failure of an episode and returns
    /// how long to wait before the next attempt.
    fn failed(&mut self, what: &str, error: &std::io::Error) -> Duration {
        let delay = match self.delay {
            None => {
                tracing::warn!(listener = what, %error, "accept failing; backing off until it succeeds");
                Self::FIRST
            }
            Some(d) => (d * 2).min(Self::MOST),
        };
        self.delay = Some(delay);
        delay
    }

    /// An accept succeeded: ends the episode.
    fn succeeded(&mut self, what: &str) {
        if self.delay.take().is_some() {
            tracing::info!(listener = what, "accepting connections again");
        }
    }
}

/// Logs "connection limit reached" once per episode.
#[derive(Debug, Default)]
struct FullNotice(AtomicBool);

impl FullNotice {
    fn full(&self, what: &str, flag: &str) {
        if !self.0.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                listener = what,
                "connection limit reached ({flag}); refusing new connections until some close"
            );
        }
    }

    fn room(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// Makes room at the bound by closing a connection; false when none can go.
type Evict = Box<dyn Fn() -> bool + Send + Sync>;

/// A connection's place under its bound: the slot, and one on the open
/// connections gauge, both given back when the connection ends.
#[derive(Debug)]
pub(super) struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Arc<AtomicU64>,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, open: &Arc<AtomicU64>) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        Self {
            _permit: permit,
            open: open.clone(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One listener's accept loop state.
pub(super) struct Acceptor {
    what: &'static str,
    flag: &'static str,
    slots: Arc<Semaphore>,
    open: Arc<AtomicU64>,
    backoff: AcceptBackoff,
    full: FullNotice,
    evict: Option<Evict>,
    /// A connection accepted at the bound, waiting for the slot an eviction
    /// frees (until the instant given): kept here, not in the future, so a
    /// `select!` that drops the future does not drop the connection.
    waiting: Option<(TcpStream, tokio::time::Instant)>,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("what", &self.what)
            .finish_non_exhaustive()
    }
}

impl Acceptor {
    /// For the listener called `what`, whose connection bound is `flag`,
    /// counting its open connections on `open`.
    pub(super) fn new(
        what: &'static str,
        flag: &'static str,
        slots: Arc<Semaphore>,
        open: Arc<AtomicU64>,
    ) -> Self {
        Self {
            what,
            flag,
            slots,
            open,
            backoff: AcceptBackoff::default(),
            full: FullNotice::default(),
            evict: None,
            waiting: None,
        }
    }

    /// At the bound, `evict` closes a connection (the admin listener's
    /// longest idle one) and the new connection takes its slot.
    pub(super) fn evicting(mut self, evict: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        self.evict = Some(Box::new(evict));
        self
    }

    /// The next connection that fits under the bound, with its slot: a
    /// failed accept backs off, a connection past the bound is closed at
    /// once. Cancel-safe (for `select!`).
    pub(super) async fn next(&mut self, listener: &TcpListener) -> (TcpStream, Slot) {
        loop {
            if let Some((_, until)) = &self.waiting {
                let slot =
                    tokio::time::timeout_at(*until, self.slots.clone().acquire_owned()).await;
                // Still there: only this call takes it, after the wait.
                let Some((tcp, _)) = self.waiting.take() else {
                    continue;
                };
                if let Ok(Ok(permit)) = slot {
                    return (tcp, Slot::new(permit, &self.open));
                }
                self.full.full(self.what, self.flag);
                drop(tcp);
            }
            let tcp = match listener.accept().await {
                Ok((tcp, _)) => {
                    self.backoff.succeeded(self.what);
                    tcp
                }
                // Out of file descriptors and the like: keep serving the
                // others, and retry as soon as some may have freed.
                Err(e) => {
                    tokio::time::sleep(self.backoff.failed(self.what, &e)).await;
                    continue;
                }
            };
            match self.slots.clone().try_acquire_owned() {
                Ok(permit) => {
                    self.full.room();
                    return (tcp, Slot::new(permit, &self.open));
                }
                // At the bound: an eviction frees a slot as soon as the
                // evicted connection's task ends.
                Err(_) if self.evict.as_ref().is_some_and(|evict| evict()) => {
                    let until = tokio::time::Instant::now() + Duration::from_secs(1);
                    self.waiting = Some((tcp, until));
                }
                Err(_) => {
                    self.full.full(self.what, self.flag);
                    drop(tcp);
                }
            }
        }
    }
}

/// The admin connections and since when each has been idle, with the
/// gauge of the busy ones.
#[derive(Debug)]
pub(crate) struct Idle {
    next: AtomicU64,
    connections: parking_lot::Mutex<HashMap<u64, Connection>>,
    busy: Arc<AtomicU64>,
}

/// One admin connection.
#[derive(Debug)]
struct Connection {
    /// Since when no request has been in progress; `None` while one is.
    idle_since: Option<Instant>,
    evict: Arc<tokio::sync::Notify>,
}

impl Idle {
    /// No connections yet; busy ones are counted on `busy`.
    pub(super) fn new(busy: Arc<AtomicU64>) -> Self {
        Self {
            next: AtomicU64::new(0),
            connections: parking_lot::Mutex::default(),
            busy,
        }
    }

    fn busy_changed(&self, busy: bool) {
        if busy {
            self.busy.fetch_add(1, Ordering::Relaxed);
        } else {
            self.busy.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A new connection, idle from now; notified when evicted.
    pub(super) fn add(&self) -> (u64, Arc<tokio::sync::Notify>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let evict = Arc::new(tokio::sync::Notify::new());
        self.connections.lock().insert(
            id,
            Connection {
                idle_since: Some(Instant::now()),
                evict: evict.clone(),
            },
        );
        (id, evict)
    }

    pub(super) fn set(&self, id: u64, busy: bool) {
        if let Some(c) = self.connections.lock().get_mut(&id) {
            if c.idle_since.is_none() != busy {
                self.busy_changed(busy);
            }
            c.idle_since = if busy { None } else { Some(Instant::now()) };
        }
    }

    /// Forgets connection `id` (its task ended).
    fn remove(&self, id: u64) {
        let gone = self.connections.lock().remove(&id);
        if gone.is_some_and(|c| c.idle_since.is_none()) {
            self.busy_changed(false);
        }
    }

    /// Closes the connection idle the longest; false when all are busy.
    pub(super) fn evict_oldest(&self) -> bool {
        let mut connections = self.connections.lock();
        let oldest = connections
            .iter()
            .filter_map(|(id, c)| c.idle_since.map(|t| (t, *id)))
            .min();
        match oldest {
            // Idle: the busy gauge does not change.
            Some((_, id)) => {
                if let Some(c) = connections.remove(&id) {
                    c.evict.notify_one();
                }
                true
            }
            None => false,
        }
    }
}

/// Forgets a connection when its task ends.
pub(super) struct Gone<'a>(pub(super) &'a Idle, pub(super) u64);

impl Drop for Gone<'_> {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}
