//! An operator's look at a client's counters, and their reset: the same
//! planning as a decision (so what is shown is what the next request
//! meets), without spending, counting, logging or showing the observers.

use super::{Decision, LimitError, Limiter, Plan, Request};

impl Limiter {
    /// Every limit `request`'s descriptors meet and what is left of each,
    /// spending nothing (every check asks for 0 hits, and no lease).
    pub async fn peek(&self, request: &Request<'_>) -> Result<Decision, LimitError> {
        let mut plan = Plan::default();
        self.plan(request, &mut plan)?;
        plan.quiet = true;
        for check in &mut plan.checks {
            check.hits = 0;
            check.lease = 0;
        }
        if !plan.checks.is_empty() {
            self.store
                .decide(&mut plan.checks, self.clock.now())
                .await
                .map_err(LimitError::Unavailable)?;
        }
        self.finish(request, &mut plan, None)
    }

    /// Deletes the counters `request`'s descriptors meet (in the store, and
    /// in the `local` failure mode's fallback): the next request starts
    /// each afresh. Returns the counters that existed.
    pub async fn reset(&self, request: &Request<'_>) -> Result<usize, LimitError> {
        let mut plan = Plan::default();
        self.plan(request, &mut plan)?;
        self.fallback.remove(plan.checks.iter().map(|c| &c.key));
        self.store
            .reset(&plan.checks, self.clock.now())
            .await
            .map_err(LimitError::Unavailable)
    }
}
