//! What the rest of Tollgate may see of the store's health, as a handle (as
//! [`super::QuotaShare`] is for the quota exchange): whether it answers, its
//! circuits, its background events and its data directory. Nothing through
//! it decides or resets; the readiness checks and `/metrics` hold one
//! instead of the limiter.

use std::sync::Arc;

use super::error::StoreError;
use super::memory::{DataEvents, Persistence};
use super::redis::{RedisEvents, RedisStatus};

/// The store's health, cheap to clone.
#[derive(Clone)]
pub struct StoreStatus(Kind);

#[derive(Clone)]
enum Kind {
    /// The embedded store, and its data directory if it keeps one.
    Memory(Option<Arc<Persistence>>),
    Redis(RedisStatus),
}

impl std::fmt::Debug for StoreStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.0 {
            Kind::Memory(_) => "memory",
            Kind::Redis(_) => "redis",
        };
        f.debug_struct("StoreStatus")
            .field("store", &kind)
            .finish_non_exhaustive()
    }
}

impl StoreStatus {
    pub(super) fn memory(persistence: Option<Arc<Persistence>>) -> Self {
        Self(Kind::Memory(persistence))
    }

    pub(super) fn redis(status: RedisStatus) -> Self {
        Self(Kind::Redis(status))
    }

    /// Whether the store answers now: always for the memory store; for
    /// Redis, its circuit closed and a PING answered (a wrong password or
    /// certificate is a `Config` error, which no wait cures).
    pub async fn check(&self) -> Result<(), StoreError> {
        match &self.0 {
            Kind::Memory(_) => Ok(()),
            Kind::Redis(redis) if redis.circuit_open() => Err(StoreError::CircuitOpen),
            Kind::Redis(redis) => redis.ping().await,
        }
    }

    /// Whether calls to the store are stopped (a shared store's circuit is
    /// open).
    pub fn circuit_open(&self) -> bool {
        matches!(&self.0, Kind::Redis(r) if r.circuit_open())
    }

    /// A shared store's events (confirming PINGs, cancellations), for
    /// `/metrics`.
    pub fn events(&self) -> Option<RedisEvents> {
        match &self.0 {
            Kind::Memory(_) => None,
            Kind::Redis(r) => Some(r.events()),
        }
    }

    /// Why the data directory is not being written, if it is not.
    pub fn data_failing(&self) -> Option<String> {
        match &self.0 {
            Kind::Memory(Some(persistence)) => persistence.failing(),
            _ => None,
        }
    }

    /// The data directory's writes and loads, for `/metrics`, if there is
    /// one.
    pub fn data_events(&self) -> Option<DataEvents> {
        match &self.0 {
            Kind::Memory(Some(persistence)) => Some(persistence.events()),
            _ => None,
        }
    }
}
