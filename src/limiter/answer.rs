//! What an answer carries besides its codes and rate limit headers: the
//! request header that names the soft limits (`over_limit: tag`) an
//! admitted request is over, for the upstream, and the body of a refusal
//! (`--over-limit-body json`), for the client.

use std::sync::Arc;

use super::headers::Wait;
use super::types::{DescriptorStatus, LimitStatus};

/// The request header that names the soft limits a request is over.
pub const OVER_LIMIT_HEADER: &str = "x-tollgate-over-limit";

/// The body of an OVER_LIMIT answer (`--over-limit-body`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverLimitBody {
    /// None: Envoy's own (empty) 429.
    #[default]
    None,
    /// `{"error":"rate_limited","retry_after_seconds":N,"rule":"NAME"}`,
    /// with `content-type: application/json`.
    Json,
}

/// The value of [`OVER_LIMIT_HEADER`] for these statuses: an RFC 8941
/// list of the policy names (a rule's name, else its path) of every soft
/// limit the request is over, each once, in request order, as a token
/// when the name is one (`per-user`) and a quoted string otherwise;
/// `None` when there is none.
pub(super) fn tags(statuses: &[DescriptorStatus]) -> Option<String> {
    let mut names: smallvec::SmallVec<[&Arc<str>; 2]> = smallvec::SmallVec::new();
    for status in statuses {
        let deciding = status
            .limit
            .as_ref()
            .filter(|_| status.tagged)
            .map(|l| &l.policy);
        let others = status
            .others
            .iter()
            .filter(|o: &&LimitStatus| o.tagged)
            .map(|o| &o.limit.policy);
        for name in deciding.into_iter().chain(others) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    if names.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(names.iter().map(|n| n.len() + 4).sum());
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        if is_token(name) {
            out.push_str(name);
        } else {
            super::headers::sf_string(&mut out, name);
        }
    }
    Some(out)
}

/// Whether `s` is an RFC 8941 sf-token: a letter or `*`, then tchars,
/// `:` or `/`.
fn is_token(s: &str) -> bool {
    let mut bytes = s.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'*');
    first_ok && bytes.all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b))
}

/// The refusal's JSON body: the error, the wait (`Retry-After`'s number,
/// `null` when no wait helps: a limit of zero, or no limit refused) and
/// the refusing limit's policy name (`null` when none: a request that
/// could not be decided). Built by serde, so a name is escaped as JSON.
pub(super) fn json_body(wait: Option<&Wait<'_>>) -> Option<String> {
    #[derive(serde::Serialize)]
    struct Refusal<'a> {
        error: &'static str,
        retry_after_seconds: Option<u64>,
        rule: Option<&'a str>,
    }
    let refusal = Refusal {
        error: "rate_limited",
        retry_after_seconds: wait.and_then(Wait::seconds),
        rule: wait.and_then(Wait::limit).map(|l| &*l.policy),
    };
    // A struct of text and numbers always serialises.
    serde_json::to_string(&refusal).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_tokens_when_they_can_be_and_quoted_otherwise() {
        for (name, token) in [
            ("per-user", true),
            ("api.user_alice/minute", true),
            ("*x", true),
            ("1st", false),
            ("a b", false),
            ("a,b", false),
            ("", false),
            ("é", false),
        ] {
            assert_eq!(is_token(name), token, "{name}");
        }
    }

    #[test]
    fn the_body_says_null_when_no_limit_refused() {
        assert_eq!(
            json_body(None).as_deref(),
            Some(r#"{"error":"rate_limited","retry_after_seconds":null,"rule":null}"#)
        );
    }
}
