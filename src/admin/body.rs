//! The admin port's request bodies, each parsed once into a type: the
//! `/json` request (the reference's JSON form of a RateLimitRequest, as the
//! proto, then borrowed as the limiter's request) and a bulk reset's
//! `{"domain", "rule", "confirm", "max_keys"}`. Every refusal is a 400 that
//! says what was wrong.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde::Deserialize;
use serde_json::Value;

use super::json;
use crate::limiter::Request;

/// A body refused: a 400 with the reason.
#[derive(Debug)]
pub(super) struct Refused(String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (StatusCode::BAD_REQUEST, format!("{}\n", self.0)).into_response()
    }
}

fn bad(reason: impl std::fmt::Display) -> Refused {
    Refused(reason.to_string())
}

/// A body: JSON, or a 400 saying why not.
pub(super) fn parse(body: &[u8]) -> Result<Value, Refused> {
    serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON: {e}")))
}

/// The `/json` request in `body`, or a 400 with the reason.
pub(super) fn request(body: &Value) -> Result<RateLimitRequest, Refused> {
    json::request_from_value(body).map_err(bad)
}

/// The `/json` request in the raw `body` (`/json`, `/counters`), or a 400
/// with the reason.
pub(super) fn proto(body: &[u8]) -> Result<RateLimitRequest, Refused> {
    json::request_from_json(body).map_err(bad)
}

/// The limiter's request, borrowed from `proto`; a malformed one is a 400
/// (the limiter's own error, with its reason).
pub(super) fn domain(proto: &RateLimitRequest) -> Result<Request<'_>, Refused> {
    crate::rls::to_domain(proto).map_err(|e| match e {
        crate::limiter::LimitError::InvalidArgument(reason) => bad(reason),
        other => bad(other),
    })
}

/// A reset of every counter of a rule, or of a domain: the body without
/// `descriptors`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BulkReset {
    /// The domain.
    pub(super) domain: String,
    /// The rule (its name or path); absent: the whole domain.
    #[serde(default)]
    pub(super) rule: Option<String>,
    /// The rule's (else the domain's) name again: a bulk reset is never an
    /// accident.
    #[serde(default)]
    pub(super) confirm: Option<String>,
    /// The most counters to delete (more: none are).
    #[serde(default)]
    pub(super) max_keys: Option<u64>,
}

impl BulkReset {
    /// The bulk reset in `body`, or a 400 naming what is wrong.
    pub(super) fn from(body: Value) -> Result<Self, Refused> {
        let reset: Self =
            serde_json::from_value(body).map_err(|e| bad(format!("a reset's body: {e}")))?;
        if reset.domain.is_empty() {
            return Err(bad(
                "a reset names a domain, and descriptors (one client) or a rule (every client of it)",
            ));
        }
        let target = reset.target();
        if reset.confirm.as_deref() != Some(target) {
            let printed = crate::rules::printable(target);
            return Err(bad(format!(
                "resetting every counter of {} '{printed}' needs \"confirm\": \"{printed}\" in the body",
                if reset.rule.is_some() {
                    "rule"
                } else {
                    "domain"
                },
            )));
        }
        Ok(reset)
    }

    /// What the reset names: the rule, else the domain.
    pub(super) fn target(&self) -> &str {
        self.rule.as_deref().unwrap_or(&self.domain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(body: Value) -> String {
        match BulkReset::from(body) {
            Ok(r) => panic!("accepted: {r:?}"),
            Err(r) => format!("{:?}", r.into_response().status()),
        }
    }

    #[test]
    fn a_bulk_reset_is_typed_confirmed_and_refuses_what_it_does_not_know() {
        let r = BulkReset::from(
            json!({"domain": "web", "rule": "web.login", "confirm": "web.login", "max_keys": 5}),
        )
        .expect("a rule's reset");
        assert_eq!((r.target(), r.max_keys), ("web.login", Some(5)));
        let r = BulkReset::from(json!({"domain": "web", "confirm": "web"})).expect("a domain's");
        assert_eq!(r.target(), "web");
        for body in [
            json!({"domain": "web", "rule": "web.login"}),
            json!({"domain": "web", "confirm": "api"}),
            json!({"domain": "", "confirm": ""}),
            json!({"domain": "web", "confirm": "web", "max_keys": -1}),
            json!({"domain": "web", "confirm": "web", "max_keys": "all"}),
            json!({"domain": "web", "confirm": "web", "maxkeys": 5}),
            json!({"rule": "web.login", "confirm": "web.login"}),
            json!(["web"]),
        ] {
            assert_eq!(refused(body.clone()), "400", "{body}");
        }
    }
}
