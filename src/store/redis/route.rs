//! Where a call goes: the bottom layer of the Redis store. A [`Route`] is
//! one server (standalone, or the master Sentinel names) with its breaker,
//! or a Cluster (see cluster/mod.rs) with a breaker per master. Every layer
//! above sends through it and knows nothing of connections or nodes.

use std::sync::Arc;
use std::time::Duration;

use redis::{RedisError, Value};

use super::breaker::Breaker;
use super::cluster::Cluster;
use super::conn::{Conn, Connections};
use super::error::redis_error;
use super::events::Events;
use super::keys::Slot;
use super::options::{RedisOptions, RedisTarget};
use super::script::Invocation;
use crate::store::StoreError;

/// One server or a Cluster; cheap to clone (tasks of their own take one).
#[derive(Clone)]
pub(super) enum Route {
    Single(Arc<Single>),
    Cluster(Arc<Cluster>),
}

/// One server: standalone, or Sentinel's master.
pub(super) struct Single {
    connections: Connections,
    breaker: Arc<Breaker>,
    /// Confirming PINGs, for `/metrics`.
    events: Arc<Events>,
    probe_interval: Duration,
    breaker_threshold: u32,
    /// Behind Sentinel: a failing master may have been replaced.
    sentinel: bool,
}

impl Route {
    /// The route to `options`' target; connects on first use.
    pub(super) fn new(options: &RedisOptions, events: Arc<Events>) -> Self {
        match &options.target {
            RedisTarget::Cluster(seeds) => {
                Route::Cluster(Arc::new(Cluster::new(seeds.clone(), options, events)))
            }
            target => Route::Single(Arc::new(Single {
                connections: Connections::new(options),
                breaker: Arc::default(),
                events,
                probe_interval: options.probe_interval,
                breaker_threshold: options.breaker_threshold,
                sentinel: matches!(target, RedisTarget::Sentinel { .. }),
            })),
        }
    }

    /// Whether keys spread over hash slots (a Cluster): a call holds one
    /// slot's keys.
    pub(super) fn clustered(&self) -> bool {
        matches!(self, Route::Cluster(_))
    }

    /// The route's key in each thread's caches (connections, the
    /// coalescer's queues).
    pub(super) fn id(&self) -> usize {
        match self {
            Route::Single(single) => single.connections.id(),
            Route::Cluster(cluster) => cluster.id(),
        }
    }

    /// How long a probe (a fresh connection and a PING, or a read of the
    /// Cluster's slot map) may take.
    pub(super) fn probe_within(&self) -> Duration {
        match self {
            Route::Single(single) => single.connections.probe_within(),
            Route::Cluster(cluster) => cluster.probe_within(),
        }
    }

    /// Runs `inv`: on the server, or on the Cluster master serving `slot`.
    pub(super) async fn invoke(
        &self,
        slot: Slot,
        inv: &Invocation<'_>,
    ) -> Result<Value, StoreError> {
        match self {
            Route::Single(single) => {
                let mut conn = single.connections.shared(&single.breaker).await?;
                inv.run(&mut conn, false).await.map_err(|e| redis_error(&e))
            }
            // Boxed: large, and Cluster only.
            Route::Cluster(cluster) => Box::pin(cluster.invoke(slot, inv)).await,
        }
    }

    /// This thread's connection for a plain command on `slot` (not a
    /// script: no redirection is followed; a moved slot is found at the
    /// next call, once the map is read).
    pub(super) async fn connection(&self, slot: Slot) -> Result<Conn, StoreError> {
        match self {
            Route::Single(single) => single.connections.shared(&single.breaker).await,
            Route::Cluster(cluster) => Box::pin(cluster.connection(slot)).await,
        }
    }

    /// This thread's connection to each master (the one server's, off a
    /// Cluster): where a SCAN must look.
    pub(super) async fn master_connections(&self) -> Result<Vec<Conn>, StoreError> {
        match self {
            Route::Single(single) => Ok(vec![single.connections.shared(&single.breaker).await?]),
            Route::Cluster(cluster) => cluster.master_connections().await,
        }
    }

    /// `call`, within the store's timeout, its error a store error.
    pub(super) async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        match self {
            Route::Single(single) => single.connections.timed(call).await,
            Route::Cluster(cluster) => cluster.timed(call).await,
        }
    }

    /// Sends PING on this thread's connection (each master's, on a
    /// Cluster), within the store's timeout.
    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Route::Single(single) => single.connections.ping(&single.breaker).await,
            Route::Cluster(cluster) => Box::pin(cluster.ping()).await,
        }
    }

    /// Connects afresh and sends PING, within the probe timeout.
    pub(super) async fn probe(&self) -> Result<(), StoreError> {
        match self {
            Route::Single(single) => single.connections.probe(&single.breaker).await,
            Route::Cluster(cluster) => Box::pin(cluster.ping()).await,
        }
    }

    /// Whether the one server's circuit is open: no call is tried. (A
    /// Cluster's masters stop calls for their own slots: see
    /// [`Route::slot_open`].)
    pub(super) fn stopped(&self) -> bool {
        matches!(self, Route::Single(single) if single.breaker.is_open())
    }

    /// Whether calls for `slot` stop at a breaker: the server's, or that of
    /// the Cluster master serving it.
    pub(super) fn slot_open(&self, slot: Slot) -> bool {
        match self {
            Route::Single(single) => single.breaker.is_open(),
            Route::Cluster(cluster) => cluster.slot_open(slot),
        }
    }

    /// Whether a circuit is open: the server's, or at least one master's.
    pub(super) fn circuit_open(&self) -> bool {
        match self {
            Route::Single(single) => single.breaker.is_open(),
            Route::Cluster(cluster) => !cluster.open_masters().is_empty(),
        }
    }

    /// Cluster masters whose circuit is open (none off a Cluster).
    pub(super) fn open_masters(&self) -> Vec<String> {
        match self {
            Route::Single(_) => Vec::new(),
            Route::Cluster(cluster) => cluster.open_masters(),
        }
    }

    /// Counts a decision's outcome against the one server's breaker (a
    /// Cluster's masters count their own calls).
    pub(super) fn settle<T>(&self, result: &Result<T, StoreError>) {
        let Route::Single(single) = self else {
            return;
        };
        match result {
            Ok(_) => single.breaker.record_ok(),
            Err(e) if e.is_transient() => {
                single.failed(e);
                // Behind Sentinel, a failing master may have been replaced
                // (a demoted one answers READONLY): every worker asks the
                // sentinels again on its next call.
                if single.sentinel {
                    single.breaker.reconnect();
                }
            }
            Err(_) => {}
        }
    }
}

impl Single {
    /// Counts a transient failure. At the threshold, Redis is asked a PING
    /// on a fresh connection; only if that fails too does the circuit open,
    /// and then Redis is probed in the background until it answers.
    fn failed(self: &Arc<Self>, error: &StoreError) {
        if !self.breaker.record_failure(self.breaker_threshold) {
            return;
        }
        let single = self.clone();
        let error = error.clone();
        tokio::spawn(async move {
            let breaker = &single.breaker;
            let answers = single.connections.probe(breaker).await.is_ok();
            breaker.confirmed(!answers);
            single.events.checked(answers);
            if answers {
                tracing::debug!(%error, "Redis calls failed but Redis answers PING; the circuit stays closed");
                return;
            }
            tracing::error!(
                %error,
                "Redis unavailable: answering from failure modes without waiting until it is back"
            );
            let mut attempts = 0u64;
            loop {
                tokio::time::sleep(single.probe_interval).await;
                attempts += 1;
                if single.connections.probe(breaker).await.is_ok() {
                    breaker.close();
                    tracing::info!(
                        probes = attempts,
                        "Redis is back: deciding through Redis again"
                    );
                    return;
                }
            }
        });
    }
}

/// `call` within `timeout`: its own error, or a timeout naming the bound.
pub(super) async fn within<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| StoreError::Timeout(timeout))?
}
