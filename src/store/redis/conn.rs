//! Connections: one multiplexed connection per worker thread and store
//! (made on first use), TLS, every call bounded by the store's timeout, and
//! Redis errors turned into store errors that say whether they pass.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{RedisError, Value};

use super::{RedisStore, RedisTarget};
use crate::store::StoreError;

#[derive(Clone)]
pub(super) enum Conn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(super) async fn invoke(
        &mut self,
        inv: &redis::ScriptInvocation<'_>,
    ) -> Result<Value, RedisError> {
        match self {
            Conn::Standalone(c) => inv.invoke_async(c).await,
            Conn::Cluster(c) => inv.invoke_async(c).await,
        }
    }

    pub(super) async fn ping(&mut self) -> Result<(), RedisError> {
        let cmd = redis::cmd("PING");
        match self {
            Conn::Standalone(c) => c.req_packed_command(&cmd).await.map(drop),
            Conn::Cluster(c) => c.req_packed_command(&cmd).await.map(drop),
        }
    }
}

thread_local! {
    /// This thread's connection to each store (by store id).
    static CONNECTIONS: RefCell<HashMap<usize, (usize, Conn)>> = RefCell::new(HashMap::new());
}

impl RedisStore {
    pub(super) async fn connect(&self) -> Result<Conn, RedisError> {
        let timeout = self.inner.options.timeout;
        match &self.inner.options.target {
            RedisTarget::Standalone(url) => {
                let client = match self.tls_certificates() {
                    Some(certs) => redis::Client::build_with_tls(url.as_str(), certs)?,
                    None => redis::Client::open(url.as_str())?,
                };
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(1);
                Ok(Conn::Standalone(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
            RedisTarget::Cluster(nodes) => {
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    .retries(1);
                if let Some(certs) = self.tls_certificates() {
                    builder = builder.certs(certs);
                }
                let client = builder.build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
        }
    }

    /// The CA to trust for `rediss://`, when one was given.
    fn tls_certificates(&self) -> Option<redis::TlsCertificates> {
        self.inner
            .options
            .tls_ca
            .as_ref()
            .map(|ca| redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.clone()),
            })
    }

    /// This thread's connection, made on first use.
    pub(super) async fn conn(&self) -> Result<Conn, StoreError> {
        let id = self.inner.id;
        let generation = self.inner.generation.load(Ordering::Acquire);
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
        let mut conn = self.conn().await?;
        self.timed(conn.ping()).await
    }

    /// Connects afresh and sends PING: what the circuit breaker probes with,
    /// since a connection made before an outage may be stuck reconnecting.
    pub async fn probe(&self) -> Result<(), StoreError> {
        let mut conn = self.timed(self.connect()).await?;
        self.timed(conn.ping()).await
    }
}

pub(super) fn redis_error(e: &RedisError) -> StoreError {
    let transient = e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_io_error()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
                | redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown)
                | redis::ErrorKind::Server(redis::ServerErrorKind::Moved)
                | redis::ErrorKind::Server(redis::ServerErrorKind::Ask)
                | redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading)
                | redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown)
                | redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        );
    StoreError::Redis {
        message: e.to_string(),
        transient,
    }
}
