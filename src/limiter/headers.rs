//! Response headers: `RateLimit-Policy` and `RateLimit` from the IETF draft
//! (draft-ietf-httpapi-ratelimit-headers-10: structured-field lists of
//! `"policy";q=..;w=..` and `"policy";r=..;t=..`), one item per matched
//! enforced limit, and `Retry-After` on refusals that a wait can cure (a
//! limit of zero never admits anything, so it advertises no retry time).
//!
//! Shadow-mode and soft limits (`over_limit: tag`) are left out: they
//! refuse nothing, and advertising them would have clients slow down for a
//! limit that is only being watched, or that only tags their requests.

use std::fmt::Write as _;

use super::types::{AppliedLimit, DescriptorStatus};
use crate::clock::{NANOS_PER_SEC, Nanos};

/// Whole seconds, rounded up: a client told 17 when 17.3 remain gets one more refusal.
fn ceil_secs(n: Nanos) -> u64 {
    n.div_ceil(NANOS_PER_SEC)
}

/// Writes `s` as a structured-field string (RFC 8941 sf-string), which
/// holds printable ASCII only: any other character is written as the
/// percent-encoding of its UTF-8 bytes (`ü` as `%c3%bc`), and `%` itself as
/// `%25`, so distinct names stay distinct (the encoding of RFC 9651's
/// display strings, inside a plain string every parser reads).
pub(super) fn sf_string(out: &mut String, s: &str) {
    out.push('"');
    if s.bytes()
        .all(|b| (b' '..=b'~').contains(&b) && !matches!(b, b'"' | b'\\' | b'%'))
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
            ' '..='~' if c != '%' => out.push(c),
            _ => {
                let mut bytes = [0; 4];
                for b in c.encode_utf8(&mut bytes).bytes() {
                    let _ = write!(out, "%{b:02x}");
                }
            }
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
    let mut wait = Wait::default();
    // Every enforced limit: each descriptor's deciding one and its others.
    let limits = statuses.iter().flat_map(DescriptorStatus::limits);
    for (limit, over_limit, remaining, reset, _) in limits {
        if limit.shadow || limit.soft {
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
            wait.add(limit, reset);
        }
    }
    let mut headers = Vec::with_capacity(3);
    if !policy.is_empty() {
        headers.push(("ratelimit-policy", policy));
        headers.push(("ratelimit", current));
    }
    if over_limit && let Some(secs) = wait.seconds() {
        headers.push(("retry-after", itoa::Buffer::new().format(secs).to_owned()));
    }
    headers
}

/// What a refusal tells the client to wait, from the limits that refused
/// it: `Retry-After`'s number, and the `--over-limit-body`'s (one
/// computation, so the two always agree).
#[derive(Debug, Default)]
pub(super) struct Wait<'a> {
    /// The longest wait, and the first limit that asked for it.
    longest: Option<(Nanos, &'a AppliedLimit)>,
    /// The first refusing limit of zero, which no wait cures.
    never: Option<&'a AppliedLimit>,
}

impl<'a> Wait<'a> {
    /// Every refusing limit of `statuses`.
    pub(super) fn of(statuses: &'a [DescriptorStatus]) -> Self {
        let mut wait = Self::default();
        for (limit, over_limit, _, reset, _) in statuses.iter().flat_map(DescriptorStatus::limits) {
            if over_limit {
                wait.add(limit, reset);
            }
        }
        wait
    }

    /// `limit` refused, to be retried after `reset`.
    fn add(&mut self, limit: &'a AppliedLimit, reset: Nanos) {
        if self.longest.is_none_or(|(longest, _)| reset > longest) {
            self.longest = Some((reset, limit));
        }
        if limit.requests_per_unit == 0 && self.never.is_none() {
            self.never = Some(limit);
        }
    }

    /// Whole seconds to wait (at least 1), or `None` when a limit of zero
    /// refused: nothing is admitted later either.
    pub(super) fn seconds(&self) -> Option<u64> {
        if self.never.is_some() {
            return None;
        }
        Some(self.longest.map_or(1, |(n, _)| ceil_secs(n)).max(1))
    }

    /// The limit that decides the wait (a zero one first, else the longest).
    pub(super) fn limit(&self) -> Option<&'a AppliedLimit> {
        self.never.or(self.longest.map(|(_, l)| l))
    }
}

#[cfg(test)]
mod sf_tests {
    use super::sf_string;

    fn sf(s: &str) -> String {
        let mut out = String::new();
        sf_string(&mut out, s);
        out
    }

    /// Printable ASCII as it is; quotes and backslashes escaped; anything
    /// else (and `%`) percent-encoded, so two names never print alike.
    #[test]
    fn names_are_written_losslessly_in_printable_ascii() {
        assert_eq!(sf("per-user"), r#""per-user""#);
        assert_eq!(sf(r#"a "b" \c"#), r#""a \"b\" \\c""#);
        assert_eq!(sf("ünï"), r#""%c3%bcn%c3%af""#);
        assert_eq!(sf("名前"), r#""%e5%90%8d%e5%89%8d""#);
        assert_eq!(sf("50%"), r#""50%25""#);
        assert_eq!(sf("a\nb"), r#""a%0ab""#);
        assert_ne!(sf("ü"), sf("%c3%bc"));
        assert_ne!(sf("ü"), sf("ö"));
    }
}
