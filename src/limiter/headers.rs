//! Response headers: `RateLimit-Policy` and `RateLimit` from the IETF draft
//! (draft-ietf-httpapi-ratelimit-headers-10: structured-field lists of
//! `"policy";q=..;w=..` and `"policy";r=..;t=..`), one item per matched
//! enforced limit, and `Retry-After` on refusals that a wait can cure (a
//! limit of zero never admits anything, so it advertises no retry time).
//!
//! Shadow-mode limits are left out: they are not enforced, and advertising
//! them would have clients slow down for a limit that is only being watched.

use super::DescriptorStatus;
use crate::clock::{NANOS_PER_SEC, Nanos};

/// Whole seconds, rounded up: a client told 17 when 17.3 remain gets one more refusal.
fn ceil_secs(n: Nanos) -> u64 {
    n.div_ceil(NANOS_PER_SEC)
}

/// Writes `s` as a structured-field string (RFC 8941 sf-string).
fn sf_string(out: &mut String, s: &str) {
    out.push('"');
    if s.bytes()
        .all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\')
    {
        out.push_str(s);
        out.push('"');
        return;
    }
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            // Only printable ASCII is allowed in an sf-string.
            _ => out.push('?'),
        }
    }
    out.push('"');
}

/// The headers for a decision.
pub fn response_headers(
    statuses: &[DescriptorStatus],
    over_limit: bool,
) -> Vec<(&'static str, String)> {
    let mut policy = String::with_capacity(64);
    let mut current = String::with_capacity(64);
    let mut retry: Option<Nanos> = None;
    let mut never = false;
    // Every enforced limit: each descriptor's deciding one and its others.
    let limits = statuses.iter().flat_map(DescriptorStatus::limits);
    for (limit, over_limit, remaining, reset) in limits {
        if limit.shadow {
            continue;
        }
        if !policy.is_empty() {
            policy.push_str(", ");
            current.push_str(", ");
        }
        // Numbers by itoa: `write!` goes through the formatting machinery,
        // a measurable share of a decision on the memory store.
        let mut n = itoa::Buffer::new();
        sf_string(&mut policy, &limit.policy);
        policy.push_str(";q=");
        policy.push_str(n.format(limit.requests_per_unit));
        policy.push_str(";w=");
        policy.push_str(n.format(limit.window_seconds));
        sf_string(&mut current, &limit.policy);
        current.push_str(";r=");
        current.push_str(n.format(remaining));
        current.push_str(";t=");
        current.push_str(n.format(ceil_secs(reset)));
        if over_limit {
            retry = Some(retry.unwrap_or(0).max(reset));
            never |= limit.requests_per_unit == 0;
        }
    }
    let mut headers = Vec::with_capacity(3);
    if !policy.is_empty() {
        headers.push(("ratelimit-policy", policy));
        headers.push(("ratelimit", current));
    }
    if over_limit && !never {
        let secs = retry.map_or(1, ceil_secs).max(1);
        headers.push(("retry-after", itoa::Buffer::new().format(secs).to_owned()));
    }
    headers
}
