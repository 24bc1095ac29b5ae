//! Connections: one multiplexed connection per worker thread and store
//! (made on first use), TLS, every call bounded by the store's timeout, and
//! Redis errors turned into store errors that say whether they pass.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::keys::Slot;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Value};

use super::error::redis_error;
use super::script::Invocation;
use super::{RedisStore, RedisTarget};
use crate::store::StoreError;

/// One thread's multiplexed connection to one server.
pub(super) type Conn = ConnectionManager;

/// PING on `conn`. An error reply (NOAUTH from a Redis that wants a
/// password) comes back as a value: Redis answering is not Redis accepting us.
async fn ping(conn: &mut Conn) -> Result<(), RedisError> {
    let reply = conn.req_packed_command(&redis::cmd("PING")).await?;
    reply.extract_error().map(drop)
}

/// How often the sentinels are asked where the master is.
const SENTINEL_POLL: std::time::Duration = std::time::Duration::from_secs(1);

thread_local! {
    /// This thread's connection to each store (by store id).
    static CONNECTIONS: RefCell<HashMap<usize, (usize, Conn)>> = RefCell::new(HashMap::new());
}

impl RedisStore {
    pub(super) async fn connect(&self) -> Result<Conn, RedisError> {
        self.connect_within(self.inner.options.timeout).await
    }

    /// A new connection whose connecting and answers may each take `timeout`.
    async fn connect_within(&self, timeout: std::time::Duration) -> Result<Conn, RedisError> {
        match &self.inner.options.target {
            RedisTarget::Standalone(url) => self.connect_one(url, timeout).await,
            RedisTarget::Sentinel {
                master,
                sentinels,
                master_prefix,
            } => {
                let addr = master_address(master, sentinels, timeout).await?;
                *self.inner.sentinel_master.lock() = Some(addr.clone());
                self.watch_master();
                self.connect_one(&format!("{master_prefix}{addr}"), timeout)
                    .await
            }
            // Cluster: one connection per master (see cluster.rs).
            RedisTarget::Cluster(_) => Err(RedisError::from((
                redis::ErrorKind::Client,
                "a Redis Cluster has no single server to connect to",
            ))),
        }
    }

    /// Behind Sentinel: asks the sentinels for the master every
    /// [`SENTINEL_POLL`] and, when it moved, makes every worker reconnect
    /// (to the new master, through the sentinels). Waiting for errors is not
    /// enough: a demoted master can stay writable until Sentinel reaches it.
    /// One task per store, for as long as the store lives.
    fn watch_master(&self) {
        if self.inner.sentinel_watch.swap(true, Ordering::AcqRel) {
            return;
        }
        /// Lets the next connection start a watcher again if this one is
        /// dropped with its runtime (the start-up probe's, say).
        struct Watching(std::sync::Weak<super::Inner>);
        impl Drop for Watching {
            fn drop(&mut self) {
                if let Some(inner) = self.0.upgrade() {
                    inner.sentinel_watch.store(false, Ordering::Release);
                }
            }
        }
        let inner = std::sync::Arc::downgrade(&self.inner);
        let watching = Watching(inner.clone());
        tokio::spawn(async move {
            let _watching = watching;
            loop {
                tokio::time::sleep(SENTINEL_POLL).await;
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let RedisTarget::Sentinel {
                    master, sentinels, ..
                } = &inner.options.target
                else {
                    return;
                };
                let timeout = inner.options.timeout.max(SENTINEL_POLL / 2);
                let Ok(addr) = master_address(master, sentinels, timeout).await else {
                    continue;
                };
                let mut current = inner.sentinel_master.lock();
                if current.as_deref() != Some(addr.as_str()) {
                    tracing::warn!(
                        from = current.as_deref().unwrap_or("?"),
                        to = %addr,
                        master = %master,
                        "Redis Sentinel: the master moved; reconnecting"
                    );
                    *current = Some(addr);
                    inner.breaker.reconnect();
                }
            }
        });
    }

    /// A connection to one server, reconnecting to it by itself.
    async fn connect_one(
        &self,
        url: &str,
        timeout: std::time::Duration,
    ) -> Result<Conn, RedisError> {
        let client = self.client(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1);
        ConnectionManager::new_with_config(client, config).await
    }

    /// How long a probe (a fresh connection and a PING, or a read of the
    /// Cluster's slot map) may take: `--redis-probe-timeout`, at least the
    /// request timeout.
    pub(super) fn probe_within(&self) -> std::time::Duration {
        self.inner
            .options
            .probe_timeout
            .max(self.inner.options.timeout)
    }

    /// A connection of its own to `url` (not this thread's shared one),
    /// connecting and answering within `within`: for probes.
    pub(super) async fn fresh_connection(
        &self,
        url: &str,
        within: std::time::Duration,
    ) -> Result<redis::aio::MultiplexedConnection, RedisError> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(within))
            .set_response_timeout(Some(within));
        self.client(url)?
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// A client for `url`, with the CA and client certificate given.
    pub(super) fn client(&self, url: &str) -> Result<redis::Client, RedisError> {
        match self.tls_certificates() {
            Some(certs) => redis::Client::build_with_tls(url, certs),
            None => redis::Client::open(url),
        }
    }

    /// Runs `inv`: on the server (standalone, or Sentinel's master), or on
    /// the Cluster master serving `slot`.
    pub(super) async fn invoke(
        &self,
        slot: Slot,
        inv: &Invocation<'_>,
    ) -> Result<Value, StoreError> {
        if self.inner.cluster.is_some() {
            // Boxed: large, and Cluster only.
            return Box::pin(self.invoke_cluster(slot, inv)).await;
        }
        let mut conn = self.conn().await?;
        inv.run(&mut conn, false).await.map_err(|e| redis_error(&e))
    }

    /// This thread's connection to the server at `url` (a Cluster node),
    /// cached under `id` while its breaker is at `generation`; made on first
    /// use.
    pub(super) async fn conn_to(
        &self,
        id: usize,
        generation: usize,
        url: &str,
    ) -> Result<Conn, StoreError> {
        let cached = CONNECTIONS.with(|c| c.borrow().get(&id).cloned());
        if let Some((_, conn)) = cached.filter(|(g, _)| *g == generation) {
            return Ok(conn);
        }
        let timeout = self.inner.options.timeout;
        // Type-erased, as connecting is a deep future (see `owner`).
        let connect: futures_util::future::BoxFuture<'_, _> =
            Box::pin(self.connect_one(url, timeout));
        let conn = self.timed(connect).await?;
        CONNECTIONS.with(|c| c.borrow_mut().insert(id, (generation, conn.clone())));
        Ok(conn)
    }

    /// The CA to trust and the client certificate to present for
    /// `rediss://`, when either was given.
    fn tls_certificates(&self) -> Option<redis::TlsCertificates> {
        let options = &self.inner.options;
        if options.tls_ca.is_none() && options.tls_client.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: options
                .tls_client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: options.tls_ca.clone(),
        })
    }

    /// This thread's connection, made on first use.
    pub(super) async fn conn(&self) -> Result<Conn, StoreError> {
        let id = self.inner.id;
        let generation = self.inner.breaker.generation();
        let cached = CONNECTIONS.with(|c| c.borrow().get(&id).cloned());
        if let Some((_, conn)) = cached.filter(|(g, _)| *g == generation) {
            return Ok(conn);
        }
        let conn = self.timed(self.connect()).await?;
        CONNECTIONS.with(|c| c.borrow_mut().insert(id, (generation, conn.clone())));
        Ok(conn)
    }

    pub(super) async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.inner.options.timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(redis_error(&e)),
            Err(_) => Err(StoreError::Timeout(self.inner.options.timeout)),
        }
    }

    /// Sends PING on this thread's connection, within the store's timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        if self.inner.cluster.is_some() {
            Box::pin(self.ping_cluster()).await?;
        } else {
            let mut conn = self.conn().await?;
            self.timed(ping(&mut conn)).await?;
        }
        match &self.inner.per_second {
            Some(per_second) => Box::pin(per_second.ping()).await,
            None => Ok(()),
        }
    }

    /// Connects afresh and sends PING, within the probe timeout: what the
    /// circuit breaker probes with, since a connection made before an
    /// outage may be stuck reconnecting.
    pub async fn probe(&self) -> Result<(), StoreError> {
        if self.inner.cluster.is_some() {
            return Box::pin(self.ping_cluster()).await;
        }
        let within = self.probe_within();
        let probe = async {
            let mut conn = self.connect_within(within).await?;
            ping(&mut conn).await
        };
        match tokio::time::timeout(within, probe).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(redis_error(&e)),
            Err(_) => Err(StoreError::Timeout(within)),
        }
    }
}

/// The master's `host:port` as the first sentinel that answers knows it
/// (`SENTINEL get-master-addr-by-name`); the error names every sentinel's.
async fn master_address(
    master: &str,
    sentinels: &[String],
    timeout: std::time::Duration,
) -> Result<String, RedisError> {
    let mut errors = Vec::new();
    for url in sentinels {
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
            Ok(Ok(None)) => {
                errors.push(format!("{}: no master named {master}", super::redact(url)))
            }
            Ok(Err(e)) => errors.push(format!("{}: {e}", super::redact(url))),
            Err(_) => errors.push(format!(
                "{}: no answer within {timeout:?}",
                super::redact(url)
            )),
        }
    }
    Err(RedisError::from((
        redis::ErrorKind::Io,
        "no sentinel gave the master's address",
        errors.join("; "),
    )))
}
