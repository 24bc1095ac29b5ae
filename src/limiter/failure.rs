//! When the store cannot decide: each descriptor gets its rule's failure mode.

use smallvec::SmallVec;

use super::{Limiter, Planned};
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
                let mut quota = check.quota;
                let n = self.options.instances.max(1);
                quota.limit = quota.limit.div_ceil(n);
                quota.burst = quota.burst.div_ceil(n).max(1);
                local.push(Check {
                    quota,
                    outcome: None,
                    ..check.clone()
                });
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
}
