//! Planning: a request's descriptors resolved to limits, and the store
//! checks they need.

use std::sync::Arc;

use smallvec::SmallVec;

use super::RequestBounds;
use super::validate::{drop_replaced, validate};
use super::{LimitError, Limiter, Planned, Request};
use crate::algorithm::HoldOp;
use crate::metrics::LimitStats;
use crate::rules::{Limit, OverLimit, Rule};
use crate::store::{Check, CounterKey, HoldCheck};

impl Limiter {
    /// Resolves every descriptor to its limits (or none) and builds the
    /// store checks, one per limit.
    pub(super) fn plan(&self, request: &Request<'_>, plan: &mut Plan) -> Result<(), LimitError> {
        validate(request, &self.options.bounds)?;
        let rules = self.rules.load();
        let hits_default = u64::from(request.hits_addend.max(1));
        plan.descriptors = request.descriptors.len();
        let Plan {
            planned,
            checks,
            unlimited,
            ..
        } = plan;
        let known_domain = rules.rules().has_domain(request.domain);
        let quiet = plan.quiet;
        for (d, descriptor) in request.descriptors.iter().enumerate() {
            // As the reference: an unknown domain has no limits, even for overrides.
            if !known_domain {
                if !quiet {
                    self.count_unmatched(None, descriptor);
                }
                continue;
            }
            if let Some(o) = descriptor.limit_override {
                // A limit sent by Envoy: per one unit, as the protocol means it.
                let limit =
                    Limit::per_unit(o.requests_per_unit, o.unit, self.options.default_algorithm);
                self.plan_limit(
                    (request, d),
                    (None, limit, false, None),
                    crate::store::scope_tag(request.domain, None),
                    (&[], None, None),
                    hits_default,
                    (planned, checks),
                );
                continue;
            }
            let Some(matched) = rules.rules().lookup(request.domain, &descriptor.entries) else {
                if !quiet {
                    self.count_unmatched(Some(request.domain), descriptor);
                }
                continue;
            };
            // A request ID's entry, last: on a node without the rules it
            // concerns the descriptor is unmatched, as any other entry no
            // rule names (refusing the request would let Envoy through).
            if matched.hold && matched.rules.is_empty() {
                if !quiet {
                    self.count_unmatched(Some(request.domain), descriptor);
                }
                continue;
            }
            let hold = matched
                .hold
                .then(|| descriptor.entries.last().copied())
                .flatten();
            for rule in matched.rules {
                let hold =
                    hold.and_then(|(key, id)| Some((crate::rules::held::op_for(key, rule)?, id)));
                let Some(mut limit) = rule.limit else {
                    // `unlimited: true`: never counted; the reference reports the
                    // most it can as remaining.
                    unlimited.push(d);
                    continue;
                };
                // An ID no store may hold (empty, or longer than the bound):
                // a take or a reservation is refused, a release or a
                // settlement frees and charges nothing.
                match hold {
                    Some((op, id)) if !id_fits(id, &self.options.bounds) => {
                        if op.is_after_the_fact() {
                            continue;
                        }
                        limit.requests_per_unit = 0;
                    }
                    _ => {}
                }
                // Its counters from the snapshot it is planned from.
                let stats = rules.stats(rule, &self.metrics);
                self.plan_limit(
                    (request, d),
                    (Some(rule.clone()), limit, rule.shadow_mode, stats),
                    rules.scope(rule),
                    (&matched.shared, matched.lane, hold),
                    hits_default,
                    (planned, checks),
                );
            }
            let max = self.options.bounds.checks;
            if checks.len() > max {
                let e = LimitError::InvalidArgument(format!(
                    "the request needs more than {max} limit checks (its descriptors' limits together); the bound is --max-checks"
                ));
                return Err(e);
            }
        }
        drop_replaced(planned, checks);
        Ok(())
    }

    /// Counts a descriptor no rule matched.
    fn count_unmatched(&self, domain: Option<&str>, descriptor: &super::Descriptor<'_>) {
        if let Some((key, _)) = descriptor.entries.first() {
            self.metrics.unmatched.count(domain, key);
        }
    }

    /// Adds one limit of descriptor `d` to the plan, with its store check.
    fn plan_limit(
        &self,
        (request, d): (&Request<'_>, usize),
        (rule, limit, shadow, stats): (Option<Arc<Rule>>, Limit, bool, Option<Arc<LimitStats>>),
        scope: u64,
        (shared, lane, hold): (&[(usize, &str)], Option<u8>, Option<HeldEntry<'_>>),
        hits_default: u64,
        (planned, checks): (&mut SmallVec<[Planned; 4]>, &mut SmallVec<[Check; 4]>),
    ) {
        let descriptor = &request.descriptors[d];
        // A lane counts in its node's counter, within its share of the limit.
        // So does a request ID: its entry is not part of the key.
        let (limit, counted) = match (lane, hold) {
            (Some(share), _) => (limit.in_lane(share), descriptor.entries.len() - 1),
            (None, Some(_)) => (limit, descriptor.entries.len() - 1),
            (None, None) => (limit, descriptor.entries.len()),
        };
        let mut key = match hold {
            Some((HoldOp::Take | HoldOp::Release, _)) => CounterKey::in_flight(request.domain),
            _ => CounterKey::with_period(
                request.domain,
                limit.algorithm,
                limit.unit,
                limit.unit_multiplier,
                limit.calendar.map(|z| z.key()),
            ),
        };
        for (i, (k, v)) in descriptor.entries[..counted].iter().enumerate() {
            let value = shared.iter().find(|s| s.0 == i).map_or(*v, |s| s.1);
            key.entry(k, value);
        }
        let hits = match hold {
            // A slot is one, whatever the descriptor's hits say.
            Some((HoldOp::Take | HoldOp::Release, _)) => 1,
            _ => descriptor.hits_addend.unwrap_or(hits_default),
        };
        // Global shadow mode makes every limit a shadow: reported, counted,
        // never enforced. A soft limit is never enforced either: it is
        // counted as shadow mode is, and tags instead of refusing.
        let soft = rule
            .as_ref()
            .is_some_and(|r| r.over_limit == OverLimit::Tag);
        let enforced = !shadow && !soft && !self.options.shadow_mode;
        let mut check = Check::new(key, limit.algorithm, limit.quota(), hits, enforced);
        check.quota_mode = self.options.quota_mode || rule.as_ref().is_some_and(|r| r.quota_mode);
        // A lane decides against the counter itself: a lease held for the
        // whole limit would let it pass its share.
        check.lease = if lane.is_some() || hold.is_some() {
            0
        } else {
            limit.lease
        };
        check.scope = scope;
        check.hold = hold.map(|(op, id)| {
            Box::new(HoldCheck {
                op,
                id: id.as_bytes().into(),
                most: match op {
                    HoldOp::Take | HoldOp::Release => limit.requests_per_unit,
                    HoldOp::Reserve | HoldOp::Settle => self.options.bounds.held_ids,
                },
            })
        });
        checks.push(check);
        planned.push(Planned {
            descriptor: d,
            rule,
            limit,
            shadow,
            soft,
            stats,
        });
    }
}

/// What a call does with a request ID, and the ID.
type HeldEntry<'a> = (HoldOp, &'a str);

/// Whether a store may hold `id`: not empty, and within
/// `--max-request-id-bytes`.
fn id_fits(id: &str, bounds: &RequestBounds) -> bool {
    !id.is_empty() && id.len() <= bounds.request_id_bytes
}

/// A request resolved to limits, ready for the store.
#[derive(Default)]
pub(super) struct Plan {
    /// Descriptors in the request.
    pub(super) descriptors: usize,
    /// One per limit, in request order; `checks` is parallel to it.
    pub(super) planned: SmallVec<[Planned; 4]>,
    pub(super) checks: SmallVec<[Check; 4]>,
    /// Descriptors matched to `unlimited: true` rules, in request order.
    pub(super) unlimited: SmallVec<[usize; 2]>,
    /// An operator's look ([`Limiter::peek`]): nothing counted or logged.
    pub(super) quiet: bool,
}
