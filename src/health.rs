//! Whether this instance should receive traffic: the readiness that
//! `/healthcheck`, gRPC health and the rules from xDS share. Made by the
//! server, handed to the admin port (which reports it) and to the xDS client
//! (which marks the first rules in force).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::limiter::Limiter;
use crate::rules::RuleSet;
use crate::store::StoreStatus;

/// What readiness reads of the rest, as handles: the rules in force, the
/// store's health, and whether a store outage takes the instance out.
#[derive(Clone)]
pub(crate) struct Readiness {
    /// The rules in force, followed across reloads.
    pub(crate) rules: Arc<dyn Fn() -> Arc<RuleSet> + Send + Sync>,
    pub(crate) store: StoreStatus,
    /// `--on-store-error unavailable`.
    pub(crate) unavailable_on_store_error: bool,
}

impl Readiness {
    /// `limiter`'s rules (followed across reloads), store health and choice.
    pub(crate) fn of(limiter: &Arc<Limiter>) -> Self {
        Self {
            rules: limiter.rules_in_force(),
            store: limiter.store().status(),
            unavailable_on_store_error: limiter.options().unavailable_on_store_error,
        }
    }
}

/// Whether this instance should receive traffic.
#[derive(Debug, Default)]
pub(crate) struct Health {
    draining: AtomicBool,
    /// Why the rules are not ready yet (waiting for the first from xDS).
    rules_pending: parking_lot::Mutex<Option<String>>,
    /// Whether an empty rule set is a valid state (rules from xDS: the
    /// server may have none to give).
    empty_rules_ok: AtomicBool,
    /// The xDS version of the rules in force.
    rules_version: parking_lot::Mutex<Option<String>>,
}

impl Health {
    /// Rules come from elsewhere (xDS): until [`Health::rules_applied`],
    /// health fails with `reason`, unless `ready_at_once`; an empty rule
    /// set is a valid state from now on.
    pub(crate) fn rules_from_server(&self, reason: &str, ready_at_once: bool) {
        self.empty_rules_ok.store(true, Ordering::SeqCst);
        *self.rules_pending.lock() = (!ready_at_once).then(|| reason.to_owned());
    }

    /// Rules of this version (from xDS) are in force.
    pub(crate) fn rules_applied(&self, version: &str) {
        *self.rules_pending.lock() = None;
        *self.rules_version.lock() = Some(version.to_owned());
    }

    /// The xDS version of the rules in force, if they came from xDS.
    pub(crate) fn rules_version(&self) -> Option<String> {
        self.rules_version.lock().clone()
    }

    /// Marks the instance as shutting down: health checks fail from now on,
    /// so load balancers drain it before it exits.
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// `Ok` when the instance should receive traffic, with a note when it
    /// is degraded; otherwise the reason it should not.
    ///
    /// A store outage is not a reason to leave, unless the operator chose
    /// `--on-store-error unavailable`: with failure modes, every replica
    /// still answers each rule as its author asked (deny for a login limit,
    /// allow elsewhere), whereas failing readiness would pull every replica
    /// at once, and Envoy would then apply its one `failure_mode_deny` to
    /// every rule alike. The outage shows in the body, the logs and metrics.
    pub(crate) async fn check(&self, of: &Readiness) -> Result<Option<String>, String> {
        if self.draining.load(Ordering::SeqCst) {
            return Err("shutting down".into());
        }
        if let Some(reason) = self.rules_pending.lock().clone() {
            return Err(reason);
        }
        if (of.rules)().domain_count() == 0 && !self.empty_rules_ok.load(Ordering::SeqCst) {
            return Err("no rules loaded".into());
        }
        let store = match of.store.check().await {
            Ok(()) => Ok(()),
            Err(crate::store::StoreError::CircuitOpen) => {
                Err("store: Redis unavailable (circuit open)".to_owned())
            }
            // A wrong password or certificate will not pass by itself:
            // fail readiness with it, whatever the failure modes.
            Err(e @ crate::store::StoreError::Config(_)) => {
                return Err(format!("store misconfigured: {e}"));
            }
            Err(e) => Err(format!("store: {e}")),
        };
        // A data directory that cannot be written: decisions go on from
        // memory (ready), and the note says a crash would lose counts.
        let data = (of.store.data_failing())
            .map(|why| format!("data directory not written ({why}); counters kept in memory"));
        match store {
            Ok(()) => Ok(data),
            Err(reason) if of.unavailable_on_store_error => Err(reason),
            Err(reason) => Ok(Some(format!("{reason}; answering from failure modes"))),
        }
    }
}
