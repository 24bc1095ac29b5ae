//! Request checks that do not need the store: validation, and `replaces`.

use smallvec::SmallVec;

use super::{LimitError, Planned, Request};
use crate::store::Check;

/// `replaces`: a matched limit whose name another matched limit replaces is
/// dropped (the descriptor is answered OK with no limit), as in the reference.
pub(super) fn drop_replaced(planned: &mut [Option<Planned>], checks: &mut SmallVec<[Check; 4]>) {
    let rules = || planned.iter().flatten().filter_map(|p| p.rule.as_deref());
    if rules().all(|r| r.replaces.is_empty()) {
        return;
    }
    let replaced: SmallVec<[usize; 4]> = planned
        .iter()
        .enumerate()
        .filter(|(_, slot)| {
            let name = slot
                .as_ref()
                .and_then(|p| p.rule.as_deref())
                .and_then(|r| r.name.as_deref());
            name.is_some_and(|name| rules().any(|r| r.replaces.iter().any(|n| n == name)))
        })
        .map(|(i, _)| i)
        .collect();
    let mut dropped: SmallVec<[usize; 4]> = replaced
        .iter()
        .filter_map(|&i| planned[i].take().map(|p| p.check))
        .collect();
    // Remove the dropped checks and renumber the rest.
    dropped.sort_unstable();
    for &index in dropped.iter().rev() {
        checks.remove(index);
    }
    for p in planned.iter_mut().flatten() {
        p.check -= dropped.iter().filter(|&&d| d < p.check).count();
    }
}

pub(super) fn validate(request: &Request<'_>) -> Result<(), LimitError> {
    if request.domain.is_empty() {
        return Err(LimitError::InvalidArgument(
            "rate limit domain must not be empty".into(),
        ));
    }
    if request.descriptors.is_empty() {
        return Err(LimitError::InvalidArgument(
            "rate limit request has no descriptors".into(),
        ));
    }
    for (i, d) in request.descriptors.iter().enumerate() {
        if d.entries.is_empty() {
            return Err(LimitError::InvalidArgument(format!(
                "descriptor {i} has no entries"
            )));
        }
        if let Some(j) = d.entries.iter().position(|(k, _)| k.is_empty()) {
            return Err(LimitError::InvalidArgument(format!(
                "descriptor {i} entry {j} has an empty key"
            )));
        }
    }
    Ok(())
}
