//! Envoy's `RateLimitService` over gRPC: proto to domain and back, and
//! nothing else.
//!
//! Envoy treats every response code other than OVER_LIMIT as OK, so each
//! status carries an explicit OK or OVER_LIMIT, never UNKNOWN.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tonic::Status;

use crate::clock::{NANOS_PER_SEC, Nanos};
use crate::limiter::{self, Decision, Descriptor, LimitError, LimitOverride, Limiter};
use crate::rules::Unit;

mod decode;
mod unary;
mod wire;

pub(crate) use decode::as_sent;
pub use unary::UnaryBody;

/// The gRPC service around a [`Limiter`].
#[derive(Debug, Clone)]
pub(crate) struct RlsService {
    limiter: Arc<Limiter>,
    otel: Option<Arc<crate::otel::Otel>>,
}

impl RlsService {
    /// Serves `limiter` (which shows each decision to the candidate rules,
    /// if any).
    pub(crate) fn new(limiter: Arc<Limiter>) -> Self {
        Self {
            limiter,
            otel: None,
        }
    }

    /// Records a span for each call.
    pub(crate) fn with_tracing(mut self, otel: Option<Arc<crate::otel::Otel>>) -> Self {
        self.otel = otel;
        self
    }

    /// The tracer, when tracing is on.
    pub(crate) fn tracing(&self) -> Option<&Arc<crate::otel::Otel>> {
        self.otel.as_ref()
    }

    /// The HTTP/2 service for this, refusing requests above the limiter's
    /// request size bound.
    pub(crate) fn into_server(self) -> unary::RlsServer {
        let max_request_bytes = self.limiter.options().bounds.request_bytes;
        unary::RlsServer::new(self, max_request_bytes)
    }
}

impl RlsService {
    /// Decides one request: the decision (to answer with), or the gRPC
    /// status to fail it with.
    async fn decision(&self, request: &RateLimitRequest) -> Result<Decision, Status> {
        let domain_request = match to_domain(request) {
            Ok(r) => r,
            Err(e) => return self.failed(&request.domain, e),
        };
        let decided = match self.limiter.decide_now(&domain_request) {
            Some(decided) => decided,
            // Boxed, so the common (memory store) path above keeps this
            // handler's future small.
            None => Box::pin(self.limiter.should_rate_limit(&domain_request)).await,
        };
        decided.or_else(|e| self.failed(&request.domain, e))
    }

    /// A request of `domain` the limiter could not decide.
    fn failed(&self, domain: &str, error: LimitError) -> Result<Decision, Status> {
        match error {
            LimitError::InvalidArgument(reason) => {
                self.undecided(Some(domain), Status::invalid_argument(reason))
            }
            e @ LimitError::Unavailable(_) => Err(status_of(e)),
        }
    }

    /// A request that cannot be decided (it does not decode, or breaks a
    /// bound), of `domain` if it could be read: refused (OVER_LIMIT) if
    /// that domain has a limit that fails closed, since Envoy lets a
    /// request through on an error unless `failure_mode_deny` is set;
    /// otherwise failed with `status` (the reference's answer).
    pub(crate) fn undecided(
        &self,
        domain: Option<&str>,
        status: Status,
    ) -> Result<Decision, Status> {
        let refused = self.limiter.denies_undecided(domain);
        crate::logging::undecided(status.message(), refused);
        if !refused {
            return Err(status);
        }
        self.limiter
            .metrics()
            .undecided_refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(self.limiter.undecided_refusal())
    }

    /// [`RlsService::decision`] inside a span, continuing the trace in
    /// `headers`, with a child span for the store call.
    async fn traced_decision(
        &self,
        otel: &crate::otel::Otel,
        headers: &http::HeaderMap,
        request: &RateLimitRequest,
    ) -> Result<Decision, Status> {
        let span = otel.request_span(headers, &request.domain, request.descriptors.len());
        let result = match to_domain(request) {
            Err(e) => self.failed(&request.domain, e),
            Ok(domain_request) => {
                let (decided, store) = self.limiter.should_rate_limit_timed(&domain_request).await;
                if let Some(call) = &store {
                    otel.store_span(&span, call.start, call.end, call.error.as_deref());
                }
                decided.or_else(|e| self.failed(&request.domain, e))
            }
        };
        span.finish(match &result {
            Ok(d) if d.over_limit => Ok("OVER_LIMIT"),
            Ok(_) => Ok("OK"),
            Err(status) => Err(status.message()),
        });
        result
    }
}

/// The gRPC status a request the limiter could not decide fails with.
fn status_of(error: LimitError) -> Status {
    match error {
        // A malformed request is the caller's bug: say what is wrong.
        LimitError::InvalidArgument(reason) => Status::invalid_argument(reason),
        // Chosen by the operator (the reference's behaviour): Envoy then
        // applies its own `failure_mode_deny`.
        e @ LimitError::Unavailable(_) => Status::unavailable(e.to_string()),
    }
}

fn unit_from_proto(unit: i32) -> Option<Unit> {
    match PbUnit::try_from(unit).ok()? {
        PbUnit::Unknown => None,
        PbUnit::Second => Some(Unit::Second),
        PbUnit::Minute => Some(Unit::Minute),
        PbUnit::Hour => Some(Unit::Hour),
        PbUnit::Day => Some(Unit::Day),
        PbUnit::Week => Some(Unit::Week),
        PbUnit::Month => Some(Unit::Month),
        PbUnit::Year => Some(Unit::Year),
    }
}

fn unit_to_proto(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

/// Borrows the wire request as a domain request; a malformed one is the
/// domain's own error (`InvalidArgument`), which each edge maps (gRPC
/// here, HTTP in `admin`).
pub fn to_domain(request: &RateLimitRequest) -> Result<limiter::Request<'_>, LimitError> {
    let mut descriptors = smallvec::SmallVec::with_capacity(request.descriptors.len());
    for (i, d) in request.descriptors.iter().enumerate() {
        let limit_override = match &d.limit {
            None => None,
            Some(o) => {
                let unit = unit_from_proto(o.unit).ok_or_else(|| {
                    LimitError::InvalidArgument(format!(
                        "descriptor {i} limit override has no valid unit ({})",
                        o.unit
                    ))
                })?;
                Some(LimitOverride {
                    requests_per_unit: o.requests_per_unit,
                    unit,
                })
            }
        };
        // Negative hits (a refund) are not supported: they are treated as a
        // check, so they never spend budget.
        let hits_addend = if d.is_negative_hits {
            Some(0)
        } else {
            d.hits_addend.as_ref().map(|h| h.value)
        };
        descriptors.push(Descriptor {
            entries: d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect(),
            limit_override,
            hits_addend,
        });
    }
    Ok(limiter::Request {
        domain: &request.domain,
        descriptors,
        hits_addend: request.hits_addend,
    })
}

/// A decision's or a status's code. Envoy treats every code but OVER_LIMIT
/// as OK, so it is always one of the two, never UNKNOWN.
fn code(over_limit: bool) -> Code {
    if over_limit {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

fn duration(n: Nanos) -> PbDuration {
    PbDuration {
        seconds: (n / NANOS_PER_SEC) as i64,
        nanos: (n % NANOS_PER_SEC) as i32,
    }
}

fn header_values(headers: Vec<(&'static str, String)>) -> Vec<HeaderValue> {
    headers
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key: key.to_owned(),
            value,
            ..Default::default()
        })
        .collect()
}

pub(crate) fn to_proto(decision: Decision) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(decision.over_limit) as i32,
        statuses: decision
            .statuses
            .into_iter()
            .map(|s| DescriptorStatus {
                code: code(s.over_limit) as i32,
                limit_remaining: s.remaining,
                duration_until_reset: s.limit.as_ref().map(|_| duration(s.reset)),
                current_limit: s.limit.map(|l| RateLimit {
                    name: l.name.to_string(),
                    requests_per_unit: l.requests_per_unit,
                    unit: unit_to_proto(l.unit) as i32,
                }),
                ..Default::default()
            })
            .collect(),
        response_headers_to_add: header_values(decision.headers),
        // Envoy adds these to the request it sends upstream (OK answers only).
        request_headers_to_add: header_values(decision.request_headers),
        // Envoy sends this as its 429's body (OVER_LIMIT answers only).
        raw_body: decision.body.map(String::into_bytes).unwrap_or_default(),
        ..Default::default()
    }
}
