//! Limits on which calls hold request IDs: `in_flight` on a descriptor,
//! `reserve: true` on a budget (see [`crate::algorithm::Held`]). A call whose
//! descriptor is the node's entries followed by `request_id: ID` takes a
//! slot or reserves; `release: ID` frees the slot; `settle: ID` settles
//! the reservation.

use std::path::PathBuf;
use std::sync::Arc;

use serde_saphyr::Spanned;

use super::error::ErrorSink;
use super::file::{RawDescriptor, RawInFlight, RawRateLimit, at};
use super::{HeldKind, Limit, LoadOptions, OverLimit, Rule, Source, Unit};
use crate::algorithm::{Algorithm, HoldOp};

/// The entry keys that hold, free or settle IDs, as the last entry of a
/// descriptor.
pub(crate) const HOLD_KEYS: [&str; 3] = ["request_id", "release", "settle"];

/// The longest `max_hold_seconds`: a day. A slot Envoy never released is
/// held this long at most.
pub(crate) const MAX_HOLD_SECONDS: u32 = 86_400;

/// The operation a descriptor's last entry asks of `rule` (`None`: the
/// entry does not concern it).
pub(crate) fn op_for(entry_key: &str, rule: &Rule) -> Option<HoldOp> {
    let kind = rule.limit?.held?;
    match (entry_key, kind) {
        ("request_id", HeldKind::InFlight) => Some(HoldOp::Take),
        ("request_id", HeldKind::Reserve) => Some(HoldOp::Reserve),
        ("release", HeldKind::InFlight) => Some(HoldOp::Release),
        ("settle", HeldKind::Reserve) => Some(HoldOp::Settle),
        _ => None,
    }
}

/// Whether `reserve: true` can be honoured on this limit: a budget on a
/// fixed window (calendar or not). Reports why not.
pub(super) fn reserve_fits(
    rl: &RawRateLimit,
    path: &str,
    algorithm: Algorithm,
    pos: Option<(u32, u32)>,
    err: ErrorSink<'_>,
) -> bool {
    let pos = rl.reserve.as_ref().and_then(|r| at(&r.referenced)).or(pos);
    if !rl.budget.as_ref().is_some_and(|b| b.value) {
        err(
            pos,
            format!(
                "'{path}' has reserve: true without budget: true; a reservation is settled at its real cost, which only a budget charges"
            ),
        );
        return false;
    }
    if algorithm != Algorithm::FixedWindow {
        err(
            pos,
            format!(
                "'{path}' reserves on a {algorithm}; reservations are refunded to the window they were charged to, which needs algorithm: fixed_window (calendar quotas included)"
            ),
        );
        return false;
    }
    true
}

/// `in_flight: {limit: N, max_hold_seconds: S}` as a limit: N slots, each
/// held S seconds at most (the period). `None` after reporting a problem.
pub(super) fn in_flight(
    raw: &Spanned<RawInFlight>,
    path: &str,
    pos: Option<(u32, u32)>,
    options: &LoadOptions,
    err: ErrorSink<'_>,
) -> Option<Limit> {
    let pos = at(&raw.referenced).or(pos);
    let limit = match &raw.value.limit {
        None => {
            err(
                pos,
                format!(
                    "in_flight on '{path}' needs a limit (`limit: N`, requests in progress at once)"
                ),
            );
            None
        }
        Some(n) if n.value.0 == 0 || n.value.0 > options.max_held_ids => {
            err(
                at(&n.referenced).or(pos),
                format!(
                    "in_flight on '{path}' has a limit of {}; it is 1 to {} (--max-held-ids: each request in progress is held by its ID)",
                    n.value.0, options.max_held_ids
                ),
            );
            None
        }
        Some(n) => Some(n.value.0),
    };
    let hold = match &raw.value.max_hold_seconds {
        None => {
            err(
                pos,
                format!(
                    "in_flight on '{path}' needs max_hold_seconds (how long a slot whose release never comes is held)"
                ),
            );
            None
        }
        Some(s) if s.value.0 == 0 || s.value.0 > MAX_HOLD_SECONDS => {
            err(
                at(&s.referenced).or(pos),
                format!(
                    "in_flight on '{path}' has max_hold_seconds {}; it is 1 to {MAX_HOLD_SECONDS} (a day)",
                    s.value.0
                ),
            );
            None
        }
        Some(s) => Some(s.value.0),
    };
    let (limit, hold) = (limit?, hold?);
    Some(Limit {
        held: Some(HeldKind::InFlight),
        unit_multiplier: hold,
        burst: limit,
        ..Limit::per_unit(limit, Unit::Second, Algorithm::FixedWindow)
    })
}

/// The rule of a node's in-flight cap.
pub(super) fn in_flight_rule(
    raw: &Spanned<RawInFlight>,
    limit: Limit,
    descriptor: &RawDescriptor,
    (file, domain): (&Arc<PathBuf>, &Arc<str>),
    (path, levels): (&str, &[String]),
    pos: Option<(u32, u32)>,
) -> Rule {
    let name = raw
        .value
        .name
        .as_ref()
        .map(|n| n.0.clone())
        .filter(|n| !n.is_empty());
    Rule {
        path: path.to_owned(),
        reported_name: name.as_deref().unwrap_or("").into(),
        policy_name: name
            .clone()
            .unwrap_or_else(|| format!("{path}/in_flight"))
            .into(),
        name,
        limit: Some(limit),
        shadow_mode: descriptor.shadow_mode.unwrap_or(false),
        over_limit: OverLimit::Refuse,
        quota_mode: false,
        replaces: Vec::new(),
        detailed_metric: descriptor.detailed_metric.unwrap_or(false),
        value_to_metric: descriptor.value_to_metric.unwrap_or(false),
        source: Source {
            file: file.clone(),
            line: at(&raw.referenced).or(pos).map_or(0, |p| p.0),
        },
        domain: (**domain).into(),
        levels: levels.iter().map(|l| l.as_str().into()).collect(),
        limit_label: Some("in_flight".into()),
        // Set when the rule joins the set.
        index: 0,
    }
}

/// Which keys a node's children use.
pub(super) type ChildKeys<'a> = &'a dyn Fn(&str) -> bool;

/// A node that holds IDs (`in_flight` or a reserved budget): no child
/// (`child_has` says which keys its children use) or lane may use a hold
/// key (a request could mean either), and its own key is not one.
pub(super) fn check_node(
    (path, key): (&str, &str),
    (holds, child_has, lane_key): (bool, ChildKeys<'_>, Option<&str>),
    pos: Option<(u32, u32)>,
    err: ErrorSink<'_>,
) {
    if !holds {
        return;
    }
    for hold in HOLD_KEYS {
        if child_has(hold) {
            err(
                pos,
                format!(
                    "'{path}' holds request IDs, and a child descriptor's key is '{hold}': a request could mean either (rename the child's key)"
                ),
            );
        }
        if lane_key == Some(hold) {
            err(
                pos,
                format!("the lane key of '{path}' is '{hold}', which names a request ID here"),
            );
        }
    }
    if HOLD_KEYS.contains(&key) {
        err(
            pos,
            format!("'{path}' holds request IDs and its own key is '{key}'; give it another key"),
        );
    }
}
