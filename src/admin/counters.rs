//! `POST /counters`: every limit a request's descriptors meet, with what is
//! left, spending nothing; `POST /counters/reset`: those counters deleted,
//! for the bearer of a token from `--admin-token-file`. Both take the body
//! `/json` takes.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AdminState;
use super::body::{self, BulkReset};
use crate::limiter::{BulkResetError, Decision};
use crate::rules::RuleSet;

/// One limit of `/counters`, in its algorithm's own terms: a window's
/// limit, used, remaining and reset; a token bucket's capacity (its
/// burst), tokens left, refill rate and time to the next token.
#[derive(Debug, Serialize)]
struct LimitView {
    /// The rule's name, else its path.
    rule: String,
    /// Where it is written (`file:line`); absent for a request's override.
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    /// The descriptor that meets it.
    descriptor: Vec<crate::limited::Entry>,
    algorithm: &'static str,
    /// Requests per unit (a bucket's refill rate).
    limit: u32,
    unit: &'static str,
    /// A window's hits counted in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    used: Option<u32>,
    /// What the next requests may take: a window's hits, a bucket's tokens.
    remaining: u32,
    /// When a window's count resets (over the limit: when a request is
    /// admitted).
    #[serde(skip_serializing_if = "Option::is_none")]
    resets_in_ms: Option<u64>,
    /// A bucket's capacity: the most tokens it holds (its burst).
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<u32>,
    /// When a bucket gains its next token (0 when full).
    #[serde(skip_serializing_if = "Option::is_none")]
    next_token_in_ms: Option<u64>,
    /// When a bucket is full again (0 when full).
    #[serde(skip_serializing_if = "Option::is_none")]
    full_in_ms: Option<u64>,
    /// Nothing is left: the next request this limit counts is refused.
    exhausted: bool,
    shadow: bool,
}

/// `POST /counters`.
pub(super) async fn counters(
    State(s): State<AdminState>,
    caller: super::Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(refused) = s.access.may_read(&headers, caller.map(|c| c.0)) {
        return refused;
    }
    if let Some(answer) = super::not_json(&s, &headers, "/counters") {
        return answer;
    }
    let proto = match body::proto(&body) {
        Ok(proto) => proto,
        Err(refused) => return refused.into_response(),
    };
    let request = match body::domain(&proto) {
        Ok(request) => request,
        Err(refused) => return refused.into_response(),
    };
    let decision = match s.handles.operations.peek(&request).await {
        Ok(d) => d,
        Err(e) => return super::limit_error(e),
    };
    if decision.statuses.iter().all(|s| s.limit.is_none()) {
        return super::no_limit(&s, &request);
    }
    let limits = views(&decision, &request, &s.handles.rules());
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "limits": limits }).to_string(),
    )
        .into_response()
}

/// `POST /counters/reset`.
pub(super) async fn reset(
    State(s): State<AdminState>,
    caller: super::Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let peer = caller.map(|c| c.0);
    let who = match s.access.may_reset(&headers, peer) {
        Ok(name) => name,
        Err(answer) => return *answer,
    };
    // The audit line names the token and the address it came from.
    let from = peer.map_or_else(|| "unknown".to_owned(), |p| p.0.to_string());
    if let Some(answer) = super::not_json(&s, &headers, "/counters/reset") {
        return answer;
    }
    // The body, read once: without descriptors, a whole rule's or
    // domain's counters.
    let body = match body::parse(&body) {
        Ok(body) => body,
        Err(refused) => return refused.into_response(),
    };
    if body
        .as_object()
        .is_some_and(|f| !f.contains_key("descriptors"))
    {
        return match BulkReset::from(body) {
            Ok(reset) => reset_all(&s, (&who, &from), &reset).await,
            Err(refused) => refused.into_response(),
        };
    }
    let proto = match body::request(&body) {
        Ok(proto) => proto,
        Err(refused) => return refused.into_response(),
    };
    let request = match body::domain(&proto) {
        Ok(request) => request,
        Err(refused) => return refused.into_response(),
    };
    match s.handles.operations.reset(&request).await {
        Ok(done) if done.limits == 0 => super::no_limit(&s, &request),
        Ok(done) => {
            let cleared = done.deleted;
            let descriptors: Vec<Vec<(&str, &str)>> = request
                .descriptors
                .iter()
                .map(|d| d.entries.to_vec())
                .collect();
            tracing::warn!(
                by = who,
                from,
                domain = crate::rules::printable(request.domain).as_ref(),
                descriptors = %crate::rules::printable(&format!("{descriptors:?}")),
                counters = cleared,
                "counters reset by an operator"
            );
            (
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::json!({ "reset": cleared, "by": who }).to_string(),
            )
                .into_response()
        }
        Err(e) => super::limit_error(e),
    }
}

/// The most counters a bulk reset clears unless the body's `max_keys` says
/// more.
const MAX_KEYS: usize = 10_000;

/// A rule's or a domain's counters (see [`BulkReset`]).
async fn reset_all(s: &AdminState, (who, from): (&str, &str), reset: &BulkReset) -> Response {
    let (domain, rule) = (reset.domain.as_str(), reset.rule.as_deref());
    let max_keys = match reset.max_keys.map(usize::try_from) {
        None => MAX_KEYS,
        Some(Ok(n)) if n <= s.access.reset_ceiling => n,
        Some(_) => {
            return (
                StatusCode::BAD_REQUEST,
                format!(
                    "max_keys {} is above --admin-reset-max-keys ({})\n",
                    reset.max_keys.unwrap_or_default(),
                    s.access.reset_ceiling
                ),
            )
                .into_response();
        }
    };
    match s.handles.operations.reset_all(domain, rule, max_keys).await {
        Ok(n) => {
            let (counters, body) = (n, serde_json::json!({"reset": n, "by": who}));
            tracing::warn!(
                by = who,
                from,
                domain = crate::rules::printable(domain).as_ref(),
                rule = rule.map(crate::rules::printable).as_deref(),
                counters,
                "counters reset by an operator"
            );
            (
                [(header::CONTENT_TYPE, "application/json")],
                body.to_string(),
            )
                .into_response()
        }
        Err(e @ (BulkResetError::NoRule(..) | BulkResetError::NoDomain(_))) => {
            (StatusCode::NOT_FOUND, format!("{e}\n")).into_response()
        }
        Err(e @ BulkResetError::Ambiguous(..)) => {
            (StatusCode::CONFLICT, format!("{e}\n")).into_response()
        }
        Err(e @ BulkResetError::TooMany(_)) => {
            (StatusCode::CONFLICT, format!("{e}\n")).into_response()
        }
        Err(e @ BulkResetError::Store(_)) => {
            (StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")).into_response()
        }
    }
}

fn views(
    decision: &Decision,
    request: &crate::limiter::Request<'_>,
    rules: &RuleSet,
) -> Vec<LimitView> {
    let mut out = Vec::new();
    for (d, status) in decision.statuses.iter().enumerate() {
        let descriptor: Vec<crate::limited::Entry> = request
            .descriptors
            .get(d)
            .map(|d| {
                d.entries
                    .iter()
                    .map(|(k, v)| crate::limited::Entry {
                        key: (*k).to_owned(),
                        value: (*v).to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (applied, _, remaining, reset, _) in status.limits() {
            let rule = applied.rule.and_then(|i| rules.rules().get(i));
            let limit = rule.and_then(|r| r.limit);
            let algorithm = limit.map_or("(the default algorithm)", |l| l.algorithm.name());
            let mut view = LimitView {
                rule: applied.policy.to_string(),
                source: rule.map(|r| format!("{}:{}", r.source.file.display(), r.source.line)),
                descriptor: descriptor.clone(),
                algorithm,
                limit: applied.requests_per_unit,
                unit: applied.unit.name(),
                used: Some(applied.requests_per_unit.saturating_sub(remaining)),
                remaining,
                resets_in_ms: Some(reset / 1_000_000),
                capacity: None,
                next_token_in_ms: None,
                full_in_ms: None,
                exhausted: remaining == 0,
                shadow: applied.shadow,
            };
            if let Some(l) =
                limit.filter(|l| l.algorithm == crate::algorithm::Algorithm::TokenBucket)
            {
                let bucket = bucket(
                    (
                        l.burst.max(1),
                        applied.requests_per_unit,
                        applied.window_seconds,
                    ),
                    remaining,
                    reset,
                );
                view.used = None;
                view.resets_in_ms = None;
                view.capacity = Some(l.burst.max(1));
                view.next_token_in_ms = Some(bucket.0);
                view.full_in_ms = Some(bucket.1);
            }
            out.push(view);
        }
    }
    out
}

/// A token bucket's next token and its being full again, in ms, from its
/// `(capacity, refill per period, period in seconds)`, the tokens left and
/// the decision's wait (the time until full when a request is admitted,
/// until one is when it is refused).
fn bucket((capacity, rate, period): (u32, u32, u64), tokens: u32, wait: u64) -> (u64, u64) {
    const MS: u64 = 1_000_000;
    if tokens >= capacity {
        return (0, 0);
    }
    // Nanoseconds between two tokens.
    let interval = (u128::from(period) * 1_000_000_000 / u128::from(rate.max(1))) as u64;
    let missing = u64::from(capacity - tokens);
    if tokens == 0 {
        // Refused: the wait is until the next token.
        return (wait / MS, (wait + (missing - 1) * interval) / MS);
    }
    let next = wait.saturating_sub((missing - 1).saturating_mul(interval));
    (next / MS, wait / MS)
}

#[cfg(test)]
mod bucket_tests {
    #[test]
    fn a_buckets_next_token_and_full_come_from_its_wait() {
        // 60 a minute (a token a second), capacity 20.
        let rate = (20, 60, 60);
        assert_eq!(
            super::bucket(rate, 20, 0),
            (0, 0),
            "full: nothing to wait for"
        );
        // 18 left: full in 1.5 s, so the next token in 0.5 s.
        assert_eq!(super::bucket(rate, 18, 1_500_000_000), (500, 1_500));
        // Empty and refused: the wait is the next token; full 19 s after.
        assert_eq!(super::bucket(rate, 0, 300_000_000), (300, 19_300));
    }
}
