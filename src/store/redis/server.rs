//! What every layer above the route asks of where its calls go: one server
//! (standalone, or Sentinel's master) or a Cluster. [`super::route::Route`]
//! is either, and answers as this trait through the one it holds; the layers
//! above know nothing of connections or nodes.

use std::future::Future;
use std::time::Duration;

use redis::{RedisError, Value};

use super::conn::Conn;
use super::keys::Slot;
use super::script::Invocation;
use crate::store::StoreError;

/// Where calls go.
pub(super) trait Server {
    /// The key in each thread's caches (connections, the coalescer's
    /// queues).
    fn id(&self) -> usize;

    /// How long a probe (a fresh connection and a PING, or a read of the
    /// Cluster's slot map) may take.
    fn probe_within(&self) -> Duration;

    /// Runs `inv`: on the server, or on the Cluster master serving `slot`,
    /// following redirections; the caller bounds it by its deadline.
    async fn invoke(&self, slot: Slot, inv: &Invocation<'_>) -> Result<Value, StoreError>;

    /// This thread's connection for a plain command on `slot` (not a
    /// script: no redirection is followed; a moved slot is found at the
    /// next call, once the map is read).
    async fn connection(&self, slot: Slot) -> Result<Conn, StoreError>;

    /// This thread's connection to each master (the one server's, off a
    /// Cluster): where a SCAN must look.
    async fn master_connections(&self) -> Result<Vec<Conn>, StoreError>;

    /// `call`, within the store's timeout, its error a store error.
    async fn timed<T>(
        &self,
        call: impl Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError>;

    /// PING on this thread's connection (each master's, on a Cluster,
    /// whose map is read first), within the store's timeout; the error
    /// names what does not answer.
    async fn ping(&self) -> Result<(), StoreError>;

    /// A fresh connection and a PING, within the probe timeout (a Cluster:
    /// as [`Server::ping`]).
    async fn probe(&self) -> Result<(), StoreError>;

    /// Whether calls for `slot` stop at a breaker: the server's, or that of
    /// the Cluster master serving it.
    fn slot_open(&self, slot: Slot) -> bool;

    /// Whether a circuit is open: the server's, or at least one master's.
    fn circuit_open(&self) -> bool;

    /// Cluster masters whose circuit is open (none off a Cluster).
    fn open_masters(&self) -> Vec<String>;
}
