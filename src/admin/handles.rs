//! What the admin port reads and does, as handles (as `rlqs/handles.rs` is
//! for the quota service): the limiter's operations an operator may ask for
//! (a decision for `/json`, a look at and a reset of counters), the rules in
//! force, the metrics, the store's health and the instances' shared views.
//! Nothing reaches the store's decisions or the limiter's options through
//! them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::health::Readiness;
use crate::limiter::{BulkResetError, Decision, LimitError, Limiter, Request, Reset};
use crate::metrics::Metrics;
use crate::rules::RuleSet;
use crate::store::redis::ViewShare;

/// A future the admin port awaits (boxed: these are an operator's calls,
/// not the decisions' hot path).
pub(crate) type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The limiter's operations the admin port offers.
pub(crate) trait Operations: Send + Sync {
    /// A decision, spending budget (`POST /json`).
    fn decide<'a>(&'a self, request: &'a Request<'_>) -> Pending<'a, Result<Decision, LimitError>>;
    /// Every limit the request meets, nothing spent (`POST /counters`).
    fn peek<'a>(&'a self, request: &'a Request<'_>) -> Pending<'a, Result<Decision, LimitError>>;
    /// Deletes the request's counters (`POST /counters/reset`).
    fn reset<'a>(&'a self, request: &'a Request<'_>) -> Pending<'a, Result<Reset, LimitError>>;
    /// Deletes every counter of a rule or a domain (a bulk reset).
    fn reset_all<'a>(
        &'a self,
        domain: &'a str,
        rule: Option<&'a str>,
        max_keys: usize,
    ) -> Pending<'a, Result<usize, BulkResetError>>;
}

impl Operations for Limiter {
    fn decide<'a>(&'a self, request: &'a Request<'_>) -> Pending<'a, Result<Decision, LimitError>> {
        Box::pin(self.should_rate_limit(request))
    }

    fn peek<'a>(&'a self, request: &'a Request<'_>) -> Pending<'a, Result<Decision, LimitError>> {
        Box::pin(Limiter::peek(self, request))
    }

    fn reset<'a>(&'a self, request: &'a Request<'_>) -> Pending<'a, Result<Reset, LimitError>> {
        Box::pin(Limiter::reset(self, request))
    }

    fn reset_all<'a>(
        &'a self,
        domain: &'a str,
        rule: Option<&'a str>,
        max_keys: usize,
    ) -> Pending<'a, Result<usize, BulkResetError>> {
        Box::pin(Limiter::reset_all(self, domain, rule, max_keys))
    }
}

/// The admin port's handles.
#[derive(Clone)]
pub(crate) struct Handles {
    pub(crate) operations: Arc<dyn Operations>,
    pub(crate) metrics: Arc<Metrics>,
    /// The rules in force and the store's health (`/healthcheck`).
    pub(crate) readiness: Readiness,
    /// Where the instances share their views of who is limited: `None` for
    /// a store no other instance shares.
    pub(crate) views: Option<ViewShare>,
    /// The largest request body read.
    pub(crate) request_bytes: usize,
}

impl Handles {
    /// `limiter`'s operations, rules (followed across reloads), metrics
    /// and store.
    pub(crate) fn of(limiter: &Arc<Limiter>) -> Self {
        Self {
            operations: limiter.clone(),
            metrics: limiter.metrics().clone(),
            readiness: Readiness::of(limiter),
            views: limiter.store().views(),
            request_bytes: limiter.options().bounds.request_bytes,
        }
    }

    /// The rules in force.
    pub(crate) fn rules(&self) -> Arc<RuleSet> {
        (self.readiness.rules)()
    }
}
