//! Request checks that do not need the store: validation, and `replaces`.

use std::collections::HashSet;

use smallvec::SmallVec;

use super::{LimitError, Planned, Request, RequestBounds};
use crate::store::Check;

/// `replaces`: a matched limit whose name another matched limit replaces is
/// dropped (a descriptor left without limits is answered OK with no limit),
/// as in the reference.
pub(super) fn drop_replaced(
    planned: &mut SmallVec<[Planned; 4]>,
    checks: &mut SmallVec<[Check; 4]>,
) {
    // Linear in the request: the names replaced by any matched rule, once.
    let replaced_names: HashSet<&str> = planned
        .iter()
        .filter_map(|p| p.rule.as_deref())
        .flat_map(|r| r.replaces.iter().map(String::as_str))
        .collect();
    if replaced_names.is_empty() {
        return;
    }
    let keep: SmallVec<[bool; 4]> = planned
        .iter()
        .map(|p| {
            !p.rule
                .as_deref()
                .and_then(|r| r.name.as_deref())
                .is_some_and(|name| replaced_names.contains(name))
        })
        .collect();
    drop(replaced_names);
    let mut flags = keep.iter();
    planned.retain(|_| flags.next() == Some(&true));
    let mut flags = keep.iter();
    checks.retain(|_| flags.next() == Some(&true));
}

pub(super) fn validate(request: &Request<'_>, bounds: &RequestBounds) -> Result<(), LimitError> {
    let invalid = |m: String| Err(LimitError::InvalidArgument(m));
    if request.domain.is_empty() {
        return invalid("rate limit domain must not be empty".into());
    }
    // Bytes as sent: a text that was not UTF-8 is up to four times longer
    // once made text (`\xff` for each such byte), and a bound on the text
    // would let a 16 KiB header refuse the whole request (which Envoy lets
    // through, every limit of it skipped).
    let over = |text: &str| crate::wire_text::wire_len_over(text, bounds.value_bytes);
    if let Some(len) = over(request.domain) {
        return invalid(format!(
            "rate limit domain is {len} bytes, above the bound of {} (--max-value-bytes)",
            bounds.value_bytes
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("rate limit request has no descriptors".into());
    }
    if request.descriptors.len() > bounds.descriptors {
        return invalid(format!(
            "rate limit request has {} descriptors, above the bound of {} (--max-descriptors)",
            request.descriptors.len(),
            bounds.descriptors
        ));
    }
    for (i, d) in request.descriptors.iter().enumerate() {
        // A descriptor without entries matches no rule and is answered OK,
        // as the reference does: Envoy sends one for a rate_limits entry
        // whose every action was skipped (`skip_if_absent`), and refusing
        // the whole request would make Envoy fail open for the others.
        if d.entries.len() > bounds.entries {
            return invalid(format!(
                "descriptor {i} has {} entries, above the bound of {} (--max-entries)",
                d.entries.len(),
                bounds.entries
            ));
        }
        for (j, (k, v)) in d.entries.iter().enumerate() {
            if k.is_empty() {
                return invalid(format!("descriptor {i} entry {j} has an empty key"));
            }
            if let Some(longest) = over(k).max(over(v)) {
                return invalid(format!(
                    "descriptor {i} entry {j} has a key or value of {longest} bytes, above the bound of {} (--max-value-bytes)",
                    bounds.value_bytes
                ));
            }
        }
    }
    Ok(())
}
