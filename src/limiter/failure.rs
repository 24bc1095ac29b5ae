//! When the store cannot decide: each descriptor gets its rule's failure mode.

use smallvec::SmallVec;

use super::{Limiter, Planned};
use crate::algorithm::HoldOp;
use crate::rules::FailureMode;
use crate::store::Check;

impl Limiter {
    /// The store could not decide: each descriptor gets its rule's failure
    /// mode. `local` ones are decided together on the in-process fallback,
    /// with the limit divided by the number of instances (rounded up, so a
    /// limit is never cut to zero).
    pub(super) fn apply_failure_modes(&self, planned: &[Planned], checks: &mut [Check]) {
        let mut local: SmallVec<[Check; 4]> = SmallVec::new();
        let mut local_of: SmallVec<[usize; 4]> = SmallVec::new();
        for (i, plan) in planned.iter().enumerate() {
            let check = &mut checks[i];
            let mode = plan.limit.failure_mode.unwrap_or(self.options.failure_mode);
            let allowed = mode == FailureMode::Allow;
            let counted = &self.metrics.failure_mode;
            let counter = match mode {
                FailureMode::Allow => &counted.allow,
                FailureMode::Deny => &counted.deny,
                FailureMode::Local => &counted.local,
            };
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            check.outcome = Some(crate::algorithm::Outcome {
                allowed,
                remaining: if allowed {
                    plan.limit.requests_per_unit
                } else {
                    0
                },
                wait: crate::clock::NANOS_PER_SEC,
                commit: None,
            });
            if mode == FailureMode::Local {
                local.push(self.local(check));
                local_of.push(i);
            }
        }
        if local.is_empty() {
            return;
        }
        let decided = self.fallback.decide(&mut local, self.clock.now());
        for (check, &i) in local.iter().zip(&local_of) {
            // The fallback is bounded like any memory store; if even it is
            // full, the descriptor is refused rather than left unlimited.
            checks[i].outcome = match decided {
                Ok(()) => check.outcome,
                Err(_) => checks[i].outcome.map(|o| crate::algorithm::Outcome {
                    allowed: false,
                    remaining: 0,
                    ..o
                }),
            };
        }
    }

    /// `check` as the fallback decides it: its limit divided by the number
    /// of instances (rounded up, so a limit is never cut to zero).
    fn local(&self, check: &Check) -> Check {
        let mut quota = check.quota;
        let n = self.options.instances.max(1);
        quota.limit = quota.limit.div_ceil(n);
        quota.burst = quota.burst.div_ceil(n).max(1);
        Check {
            quota,
            outcome: None,
            ..check.clone()
        }
    }

    /// The store decided: a release of a limit whose failure mode is
    /// `local` frees the ID's slot in the fallback too, where a take
    /// answered while the store was down holds it (else it would hold it
    /// until `max_hold_seconds`, and the next outage would find the cap
    /// fuller than it is). A release of an ID the fallback does not hold
    /// writes nothing there.
    pub(super) fn release_locally(&self, planned: &[Planned], checks: &[Check]) {
        let mut local: SmallVec<[Check; 2]> = planned
            .iter()
            .zip(checks)
            .filter(|(plan, check)| {
                check.hold.as_ref().is_some_and(|h| h.op == HoldOp::Release)
                    && plan.limit.failure_mode.unwrap_or(self.options.failure_mode)
                        == FailureMode::Local
            })
            .map(|(_, check)| self.local(check))
            .collect();
        if !local.is_empty() {
            // A release is always admitted; a full fallback writes nothing.
            let _ = self.fallback.decide(&mut local, self.clock.now());
        }
    }
}
