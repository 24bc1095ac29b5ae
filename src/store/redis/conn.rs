//! Connections: one multiplexed connection per worker thread and server
//! (made on first use, made again after an outage or a Sentinel failover),
//! fresh ones for probes, TLS, and every call bounded by the store's
//! timeout. Behind Sentinel, where the master is.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Value};

use super::breaker::Breaker;
use super::error::redis_error;
use super::options::{RedisOptions, RedisTarget, redact};
use crate::store::StoreError;

/// One thread's multiplexed connection to one server.
pub(super) type Conn = ConnectionManager;

/// How often the sentinels are asked where the master is.
const SENTINEL_POLL: Duration = Duration::from_secs(1);

thread_local! {
    /// This thread's connection to each server (by [`cache_id`]), with the
    /// generation it was made at.
    static CONNECTIONS: RefCell<HashMap<usize, (usize, Conn)>> = RefCell::new(HashMap::new());
}

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// A key of its own in every thread's connection cache: one per store and
/// per Cluster node.
pub(super) fn cache_id() -> usize {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A store's connections.
pub(super) struct Connections {
    /// The store's key in each thread's cache.
    id: usize,
    /// Where the store's own connections go (a Cluster's go to its nodes).
    server: Server,
    timeout: Duration,
    /// How long a probe may take: `--redis-probe-timeout`, at least the
    /// request timeout.
    probe_within: Duration,
    tls: Option<redis::TlsCertificates>,
}

enum Server {
    Url(String),
    Sentinel(Arc<Sentinel>),
    /// A Cluster has no single server: one connection per master.
    Cluster,
}

/// A master found through Redis Sentinel, and watched.
struct Sentinel {
    master: String,
    sentinels: Vec<String>,
    /// The master's URL before its `host:port`.
    master_prefix: String,
    /// The master's address last seen.
    seen: parking_lot::Mutex<Option<String>>,
    /// The task that watches for the master moving runs.
    watching: AtomicBool,
}

impl Connections {
    pub(super) fn new(options: &RedisOptions) -> Self {
        let server = match &options.target {
            RedisTarget::Standalone(url) => Server::Url(url.clone()),
            RedisTarget::Cluster(_) => Server::Cluster,
            RedisTarget::Sentinel {
                master,
                sentinels,
                master_prefix,
            } => Server::Sentinel(Arc::new(Sentinel {
                master: master.clone(),
                sentinels: sentinels.clone(),
                master_prefix: master_prefix.clone(),
                seen: parking_lot::Mutex::new(None),
                watching: AtomicBool::new(false),
            })),
        };
        let tls = (options.tls_ca.is_some() || options.tls_client.is_some()).then(|| {
            redis::TlsCertificates {
                client_tls: options
                    .tls_client
                    .as_ref()
                    .map(|(cert, key)| redis::ClientTlsConfig {
                        client_cert: cert.clone(),
                        client_key: key.clone(),
                    }),
                root_cert: options.tls_ca.clone(),
            }
        });
        Self {
            id: cache_id(),
            server,
            timeout: options.timeout,
            probe_within: options.probe_timeout.max(options.timeout),
            tls,
        }
    }

    /// The store's key in each thread's caches (connections, and the
    /// coalescer's queues).
    pub(super) fn id(&self) -> usize {
        self.id
    }

    /// How long a probe (a fresh connection and a PING, or a read of the
    /// Cluster's slot map) may take.
    pub(super) fn probe_within(&self) -> Duration {
        self.probe_within
    }

    /// This thread's connection to the store's server, made on first use
    /// and again when `breaker` asks for new ones.
    pub(super) async fn shared(&self, breaker: &Arc<Breaker>) -> Result<Conn, StoreError> {
        let generation = breaker.generation();
        if let Some(conn) = cached(self.id, generation) {
            return Ok(conn);
        }
        // Type-erased, as for a Cluster node: connecting (behind Sentinel,
        // asking the sentinels first) is a deep future of several KB, and
        // every request's call would carry it, built and copied with the
        // call whether or not it connects.
        let connect: futures_util::future::BoxFuture<'_, _> =
            Box::pin(self.connect(self.timeout, breaker));
        let conn = self.timed(connect).await?;
        CONNECTIONS.with(|c| c.borrow_mut().insert(self.id, (generation, conn.clone())));
        Ok(conn)
    }

    /// This thread's connection to the server at `url` (a Cluster node),
    /// cached under `id` while its breaker is at `generation`; made on first
    /// use.
    pub(super) async fn shared_to(
        &self,
        id: usize,
        generation: usize,
        url: &str,
    ) -> Result<Conn, StoreError> {
        if let Some(conn) = cached(id, generation) {
            return Ok(conn);
        }
        // Type-erased: connecting is a deep future, and every request's
        // future would carry its type.
        let connect: futures_util::future::BoxFuture<'_, _> =
            Box::pin(self.connect_one(url, self.timeout));
        let conn = self.timed(connect).await?;
        CONNECTIONS.with(|c| c.borrow_mut().insert(id, (generation, conn.clone())));
        Ok(conn)
    }

    /// A connection of its own to `url` (not this thread's shared one),
    /// connecting and answering within `within`: for probes.
    pub(super) async fn fresh_to(
        &self,
        url: &str,
        within: Duration,
    ) -> Result<redis::aio::MultiplexedConnection, RedisError> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(within))
            .set_response_timeout(Some(within));
        self.client(url)?
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// PING on this thread's connection, within the store's timeout.
    pub(super) async fn ping(&self, breaker: &Arc<Breaker>) -> Result<(), StoreError> {
        let mut conn = self.shared(breaker).await?;
        self.timed(ping(&mut conn)).await
    }

    /// A fresh connection and a PING, within the probe timeout: what the
    /// circuit breaker probes with, since a connection made before an
    /// outage may be stuck reconnecting.
    pub(super) async fn probe(&self, breaker: &Arc<Breaker>) -> Result<(), StoreError> {
        let within = self.probe_within;
        let probe = async {
            let mut conn = self.connect(within, breaker).await?;
            ping(&mut conn).await
        };
        within_time(within, probe).await
    }

    /// `call`, within the store's timeout, its error a store error.
    pub(super) async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        within_time(self.timeout, call).await
    }

    /// A new connection to the store's server whose connecting and answers
    /// may each take `timeout`; behind Sentinel, to the master the sentinels
    /// name now (and the master is watched from then on, `breaker` asking
    /// for new connections when it moves).
    async fn connect(&self, timeout: Duration, breaker: &Arc<Breaker>) -> Result<Conn, RedisError> {
        match &self.server {
            Server::Url(url) => self.connect_one(url, timeout).await,
            Server::Sentinel(sentinel) => {
                let addr = sentinel.master_address(timeout).await?;
                *sentinel.seen.lock() = Some(addr.clone());
                sentinel.watch(self.timeout, breaker);
                self.connect_one(&format!("{}{addr}", sentinel.master_prefix), timeout)
                    .await
            }
            Server::Cluster => Err(RedisError::from((
                redis::ErrorKind::Client,
                "a Redis Cluster has no single server to connect to",
            ))),
        }
    }

    /// A connection to one server, reconnecting to it by itself.
    async fn connect_one(&self, url: &str, timeout: Duration) -> Result<Conn, RedisError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1);
        ConnectionManager::new_with_config(self.client(url)?, config).await
    }

    /// A client for `url`, with the CA and client certificate given.
    fn client(&self, url: &str) -> Result<redis::Client, RedisError> {
        match &self.tls {
            Some(certs) => redis::Client::build_with_tls(url, certs.clone()),
            None => redis::Client::open(url),
        }
    }
}

/// `call` within `limit`, its error a store error.
async fn within_time<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(redis_error(&e)),
        Err(_) => Err(StoreError::Timeout(limit)),
    }
}

/// This thread's connection under `id`, if made at `generation`.
fn cached(id: usize, generation: usize) -> Option<Conn> {
    CONNECTIONS.with(|c| {
        c.borrow()
            .get(&id)
            .filter(|(g, _)| *g == generation)
            .map(|(_, conn)| conn.clone())
    })
}

/// PING on `conn`. An error reply (NOAUTH from a Redis that wants a
/// password) comes back as a value: Redis answering is not Redis accepting us.
async fn ping(conn: &mut Conn) -> Result<(), RedisError> {
    let reply: Value = conn.req_packed_command(&redis::cmd("PING")).await?;
    reply.extract_error().map(drop)
}

impl Sentinel {
    /// Asks the sentinels for the master every [`SENTINEL_POLL`] and, when
    /// it moved, makes every worker reconnect (to the new master, through
    /// the sentinels). Waiting for errors is not enough: a demoted master
    /// can stay writable until Sentinel reaches it. One task per store, for
    /// as long as the store lives.
    fn watch(self: &Arc<Self>, timeout: Duration, breaker: &Arc<Breaker>) {
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Lets the next connection start a watcher again if this one is
        /// dropped with its runtime (the start-up probe's, say).
        struct Watching(Weak<Sentinel>);
        impl Drop for Watching {
            fn drop(&mut self) {
                if let Some(sentinel) = self.0.upgrade() {
                    sentinel.watching.store(false, Ordering::Release);
                }
            }
        }
        let (sentinel, breaker) = (Arc::downgrade(self), Arc::downgrade(breaker));
        let watching = Watching(sentinel.clone());
        let timeout = timeout.max(SENTINEL_POLL / 2);
        tokio::spawn(async move {
            let _watching = watching;
            loop {
                tokio::time::sleep(SENTINEL_POLL).await;
                let (Some(sentinel), Some(breaker)) = (sentinel.upgrade(), breaker.upgrade())
                else {
                    return;
                };
                let Ok(addr) = sentinel.master_address(timeout).await else {
                    continue;
                };
                let mut seen = sentinel.seen.lock();
                if seen.as_deref() != Some(addr.as_str()) {
                    tracing::warn!(
                        from = seen.as_deref().unwrap_or("?"),
                        to = %addr,
                        master = %sentinel.master,
                        "Redis Sentinel: the master moved; reconnecting"
                    );
                    *seen = Some(addr);
                    breaker.reconnect();
                }
            }
        });
    }

    /// The master's `host:port` as the first sentinel that answers knows it
    /// (`SENTINEL get-master-addr-by-name`); the error names every
    /// sentinel's.
    async fn master_address(&self, timeout: Duration) -> Result<String, RedisError> {
        let master = &self.master;
        let mut errors = Vec::new();
        for url in &self.sentinels {
            let ask = async {
                let client = redis::Client::open(url.as_str())?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(master)
                    .query_async(&mut conn)
                    .await?;
                Ok::<_, RedisError>(addr)
            };
            match tokio::time::timeout(timeout, ask).await {
                Ok(Ok(Some((host, port)))) => return Ok(format!("{host}:{port}")),
                Ok(Ok(None)) => errors.push(format!("{}: no master named {master}", redact(url))),
                Ok(Err(e)) => errors.push(format!("{}: {e}", redact(url))),
                Err(_) => errors.push(format!("{}: no answer within {timeout:?}", redact(url))),
            }
        }
        Err(RedisError::from((
            redis::ErrorKind::Io,
            "no sentinel gave the master's address",
            errors.join("; "),
        )))
    }
}
