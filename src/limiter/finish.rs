//! Finishing: the store's outcomes (or its failure) turned into the
//! decision.

use std::sync::Arc;

use super::headers::Wait;
use super::{
    AppliedLimit, Decision, DescriptorStatus, LimitError, LimitStatus, Limiter, OverLimitBody,
    Plan, Planned, Request, answer, response_headers,
};
use crate::clock::Clock;
use crate::store::{StoreError, refused};

impl Limiter {
    /// Turns the store's outcomes (or its failure) into the decision.
    /// (The plan is borrowed: it is large, and moving it costs.)
    pub(super) fn finish(
        &self,
        request: &Request<'_>,
        plan: &mut Plan,
        failed: Option<StoreError>,
    ) -> Result<Decision, LimitError> {
        let Plan {
            descriptors,
            planned,
            checks,
            unlimited,
            quiet,
        } = plan;
        let descriptors = *descriptors;
        if let Some(err) = failed {
            if self.options.unavailable_on_store_error {
                let err = LimitError::Unavailable(err);
                self.count_error(&err);
                return Err(err);
            }
            tracing::debug!(%err, "store failed; answering from failure modes");
            // Counted in the store's metrics; summarised in the log, where a
            // full memory store or a Redis outage must be seen.
            crate::logging::store_failed(&err.to_string());
            self.apply_failure_modes(planned, checks);
        } else {
            self.release_locally(planned, checks);
        }
        let mut statuses = Vec::with_capacity(descriptors);
        // `planned` and `unlimited` are in request order: walk them alongside.
        let mut limits = planned.iter().zip(checks.iter()).enumerate().peekable();
        // The request's deciding limit: its rank and its plan's index.
        let mut deciding: Option<((bool, bool, u64), usize, u32)> = None;
        let mut unlimited = unlimited.iter().peekable();
        // One refusal line per request (its line lists every descriptor):
        // a request of 128 refused descriptors is one step, not 128.
        let mut logged = false;
        for d in 0..descriptors {
            let mut decided: Option<((bool, bool, u64), LimitStatus)> = None;
            let mut others = Vec::new();
            while let Some((index, (plan, check))) = limits.next_if(|(_, (p, _))| p.descriptor == d)
            {
                let (allowed, remaining, reset) = match check.outcome {
                    Some(o) => (o.allowed, o.remaining, o.wait),
                    None => (true, plan.limit.requests_per_unit, 0),
                };
                if !*quiet {
                    self.count_decision(plan, check, allowed, remaining);
                }
                if !allowed && !*quiet && !logged {
                    logged = true;
                    self.log_refusal(request, plan, check, check.enforced);
                }
                let status = LimitStatus {
                    over_limit: !allowed && check.enforced,
                    limit: applied(plan, check.scope, &*self.clock),
                    remaining,
                    reset,
                    // Global shadow mode changes no answer: it tags nothing.
                    tagged: !allowed && plan.soft && !self.options.shadow_mode,
                };
                // The deciding limit: of those that refused (enforced before
                // shadow), the one with the longest wait, which is what
                // Retry-After says; else the one with the least left.
                let rank = (
                    !status.over_limit,
                    allowed,
                    if allowed {
                        u64::from(remaining)
                    } else {
                        u64::MAX - status.reset
                    },
                );
                if plan.rule.is_some() && deciding.is_none_or(|(best, _, _)| rank < best) {
                    deciding = Some((rank, index, remaining));
                }
                match &decided {
                    Some((best, _)) if *best <= rank => others.push(status),
                    _ => others.extend(decided.replace((rank, status)).map(|(_, s)| s)),
                }
            }
            let decided = decided.map(|(_, s)| s);
            let is_unlimited = unlimited.next_if_eq(&&d).is_some();
            statuses.push(match decided {
                Some(s) => DescriptorStatus {
                    over_limit: s.over_limit,
                    limit: Some(s.limit),
                    remaining: s.remaining,
                    reset: s.reset,
                    others,
                    tagged: s.tagged,
                },
                None => DescriptorStatus {
                    over_limit: false,
                    limit: None,
                    remaining: if is_unlimited { u32::MAX } else { 0 },
                    reset: 0,
                    others,
                    tagged: false,
                },
            });
        }
        // The store's rule, quota mode included: what it refused, nothing spent.
        let over_limit = refused(checks.iter());
        let mut headers = if self.options.response_headers {
            response_headers(&statuses, over_limit)
        } else {
            Vec::new()
        };
        // A refused request goes no further: its soft limits tag nothing.
        let request_headers = match over_limit {
            false => answer::tags(&statuses)
                .map(|tags| vec![(answer::OVER_LIMIT_HEADER, tags)])
                .unwrap_or_default(),
            true => Vec::new(),
        };
        let body = self.refusal_body(over_limit, Some(&statuses), &mut headers);
        // Moved out of the plan (done with): no count on the rule's Arc.
        let deciding = deciding.and_then(|(_, index, remaining)| {
            let rule = planned.get_mut(index)?.rule.take()?;
            Some(super::Deciding { rule, remaining })
        });
        Ok(Decision {
            over_limit,
            statuses,
            headers,
            request_headers,
            body,
            deciding,
        })
    }

    /// A refusal's body, as `--over-limit-body` asks (with its
    /// `content-type` added to `headers`: Envoy says text/plain otherwise);
    /// `None` for an admitted request or `none`.
    fn refusal_body(
        &self,
        over_limit: bool,
        statuses: Option<&[DescriptorStatus]>,
        headers: &mut Vec<(&'static str, String)>,
    ) -> Option<String> {
        // Nothing is computed for an admitted request, nor with `none`.
        if !over_limit || self.options.over_limit_body != OverLimitBody::Json {
            return None;
        }
        let body = answer::json_body(statuses.map(Wait::of).as_ref())?;
        headers.push(("content-type", "application/json".to_owned()));
        Some(body)
    }

    /// The refusal of a request that could not be decided (see
    /// `RlsService::undecided`): no limit refused it, so it has no
    /// statuses, no rate limit headers and no wait to tell.
    pub(crate) fn undecided_refusal(&self) -> Decision {
        let mut headers = Vec::new();
        let body = self.refusal_body(true, None, &mut headers);
        Decision {
            over_limit: true,
            statuses: Vec::new(),
            headers,
            request_headers: Vec::new(),
            body,
            deciding: None,
        }
    }
}

fn applied(plan: &Planned, scope: u64, clock: &dyn Clock) -> AppliedLimit {
    let (name, policy) = match &plan.rule {
        Some(rule) => (rule.reported_name.clone(), rule.policy_name.clone()),
        None => (Arc::from(""), Arc::from("override")),
    };
    AppliedLimit {
        name,
        policy,
        requests_per_unit: plan.limit.requests_per_unit,
        unit: plan.limit.unit,
        from_request: plan.rule.is_none(),
        rule: plan.rule.as_ref().map(|r| r.index),
        scope,
        window_seconds: match plan.limit.calendar {
            None => plan.limit.period_seconds(),
            Some(_) => {
                // Only calendar windows need the time (a clock read costs).
                let w = plan.limit.quota().window_at(clock.now());
                (w.end - w.start)
                    .div_ceil(crate::clock::NANOS_PER_SEC / crate::algorithm::NANOS_PER_TICK)
            }
        },
        shadow: plan.shadow,
        soft: plan.soft,
    }
}
