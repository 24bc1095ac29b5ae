//! What the quota service reads from the rest of Tollgate, as handles: the
//! rules in force, the store its instances share (if any), and the clock.
//! Its decisions take the time as an argument; the clock is read only at
//! its edges (a report arriving, the admin view, the ticker).

use std::sync::Arc;

use crate::clock::{Clock, Nanos};
use crate::limiter::Limiter;
use crate::rules::RuleSet;
use crate::store::QuotaShare;

/// The quota service's handles.
#[derive(Clone)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct Handles {
    /// The rules in force, read when a report arrives and at each tick, so
    /// a reload reaches the quota service.
    pub rules: Arc<dyn Fn() -> Arc<RuleSet> + Send + Sync>,
    /// Where the instances sharing a store exchange their weights and
    /// usage; `None` for a store no other instance shares.
    pub share: Option<QuotaShare>,
    /// The clock its edges read.
    pub clock: Arc<dyn Clock>,
}

impl Handles {
    /// `limiter`'s rules (followed across reloads), store and clock.
    #[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
    pub fn of(limiter: &Arc<Limiter>) -> Self {
        Self {
            rules: limiter.rules_in_force(),
            share: limiter.store().quota_share(),
            clock: limiter.clock().clone(),
        }
    }

    /// The time now, by the clock.
    pub(super) fn now(&self) -> Nanos {
        self.clock.now()
    }
}

impl std::fmt::Debug for Handles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handles")
            .field("shared", &self.share.is_some())
            .finish_non_exhaustive()
    }
}
