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
use super::server::Server;
use crate::store::StoreError;

/// One server or a Cluster; cheap to clone (tasks of their own take one).
#[derive(Clone)]
pub(super) struct Route(Kind);

#[derive(Clone)]
enum Kind {
    Single(Arc<Single>),
    Cluster(Arc<Cluster>),
}

/// One server: standalone, or Sentinel's master.
struct Single {
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
        Route(match &options.target {
            RedisTarget::Cluster(seeds) => {
                Kind::Cluster(Arc::new(Cluster::new(seeds.clone(), options, events)))
            }
            target => Kind::Single(Arc::new(Single {
                connections: Connections::new(options),
                breaker: Arc::default(),
                events,
                probe_interval: options.probe_interval,
                breaker_threshold: options.breaker_threshold,
                sentinel: matches!(target, RedisTarget::Sentinel { .. }),
            })),
        })
    }

    /// Whether keys spread over hash slots (a Cluster): a call holds one
    /// slot's keys.
    pub(super) fn clustered(&self) -> bool {
        matches!(&self.0, Kind::Cluster(_))
    }

    /// Whether the one server's circuit is open: no call is tried. (A
    /// Cluster's masters stop calls for their own slots: see
    /// [`Route::slot_open`].)
    pub(super) fn stopped(&self) -> bool {
        matches!(&self.0, Kind::Single(single) if single.breaker.is_open())
    }

    /// Counts a decision's outcome against the one server's breaker (a
    /// Cluster's masters count their own calls).
    pub(super) fn settle<T>(&self, result: &Result<T, StoreError>) {
        let Kind::Single(single) = &self.0 else {
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

impl Server for Route {
    fn id(&self) -> usize {
        match &self.0 {
            Kind::Single(single) => single.id(),
            Kind::Cluster(cluster) => cluster.id(),
        }
    }

    fn probe_within(&self) -> Duration {
        match &self.0 {
            Kind::Single(single) => single.probe_within(),
            Kind::Cluster(cluster) => cluster.probe_within(),
        }
    }

    async fn invoke(&self, slot: Slot, inv: &Invocation<'_>) -> Result<Value, StoreError> {
        match &self.0 {
            Kind::Single(single) => single.invoke(slot, inv).await,
            // Boxed: large, and Cluster only.
            Kind::Cluster(cluster) => Box::pin(cluster.invoke(slot, inv)).await,
        }
    }

    async fn connection(&self, slot: Slot) -> Result<Conn, StoreError> {
        match &self.0 {
            Kind::Single(single) => single.connection(slot).await,
            Kind::Cluster(cluster) => Box::pin(cluster.connection(slot)).await,
        }
    }

    async fn master_connections(&self) -> Result<Vec<Conn>, StoreError> {
        match &self.0 {
            Kind::Single(single) => single.master_connections().await,
            Kind::Cluster(cluster) => cluster.master_connections().await,
        }
    }

    async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        match &self.0 {
            Kind::Single(single) => single.timed(call).await,
            Kind::Cluster(cluster) => cluster.timed(call).await,
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        match &self.0 {
            Kind::Single(single) => single.ping().await,
            Kind::Cluster(cluster) => Box::pin(cluster.ping()).await,
        }
    }

    async fn probe(&self) -> Result<(), StoreError> {
        match &self.0 {
            Kind::Single(single) => single.probe().await,
            Kind::Cluster(cluster) => Box::pin(cluster.probe()).await,
        }
    }

    fn slot_open(&self, slot: Slot) -> bool {
        match &self.0 {
            Kind::Single(single) => single.slot_open(slot),
            Kind::Cluster(cluster) => cluster.slot_open(slot),
        }
    }

    fn circuit_open(&self) -> bool {
        match &self.0 {
            Kind::Single(single) => single.circuit_open(),
            Kind::Cluster(cluster) => cluster.circuit_open(),
        }
    }

    fn open_masters(&self) -> Vec<String> {
        match &self.0 {
            Kind::Single(single) => single.open_masters(),
            Kind::Cluster(cluster) => cluster.open_masters(),
        }
    }
}

impl Server for Single {
    fn id(&self) -> usize {
        self.connections.id()
    }

    fn probe_within(&self) -> Duration {
        self.connections.probe_within()
    }

    async fn invoke(&self, _slot: Slot, inv: &Invocation<'_>) -> Result<Value, StoreError> {
        let mut conn = self.connections.shared(&self.breaker).await?;
        inv.run(&mut conn, false).await.map_err(|e| redis_error(&e))
    }

    async fn connection(&self, _slot: Slot) -> Result<Conn, StoreError> {
        self.connections.shared(&self.breaker).await
    }

    async fn master_connections(&self) -> Result<Vec<Conn>, StoreError> {
        Ok(vec![self.connections.shared(&self.breaker).await?])
    }

    async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, RedisError>>,
    ) -> Result<T, StoreError> {
        self.connections.timed(call).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.connections.ping(&self.breaker).await
    }

    async fn probe(&self) -> Result<(), StoreError> {
        self.connections.probe(&self.breaker).await
    }

    fn slot_open(&self, _slot: Slot) -> bool {
        self.breaker.is_open()
    }

    fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }

    fn open_masters(&self) -> Vec<String> {
        Vec::new()
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
