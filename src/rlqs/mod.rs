//! Envoy's Rate Limit Quota Service (RLQS,
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`)
//! from the same rules as ShouldRateLimit.
//!
//! Each Envoy opens one bidirectional stream per domain and reports, every
//! few seconds, how many requests it allowed and denied per bucket (a map
//! of strings its `bucket_matchers` build). Tollgate maps each bucket to a
//! rule ([`crate::rules::RuleSet::lookup_bucket`]), divides the rule's
//! rate among the Envoys that report the bucket in proportion to their
//! demand ([`share`]), and answers with token buckets that Envoy enforces
//! locally: no call per request. Several Tollgate instances share their
//! clients' weights and usage through Redis ([`quotas::Quotas::tick`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status, Streaming};

mod answer;
mod bucket;
mod error;
mod handles;
mod options;
mod outbox;
mod quotas;
mod server;
pub(crate) mod share;
mod sync;
mod view;
mod wire;

#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub, unused_imports))]
pub use answer::Answer;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub, unused_imports))]
pub use error::QuotaError;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub use handles::Handles;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub use options::QuotaOptions;
pub(crate) use options::Unmatched;
#[cfg(test)]
use options::{MAX_CLIENT_NAME, MAX_DEPARTED};
#[cfg(test)]
use outbox::Inbox;
pub(crate) use outbox::Outbound;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub use quotas::Quotas;

/// The start of every gRPC path of the quota service (the server dispatches
/// on it, and holds its streams' connections busy while they last).
pub(crate) const SERVICE_PATH: &str = "/envoy.service.rate_limit_quota.v3.";

/// The request header (gRPC metadata) a client may name itself with, so its
/// share survives a reconnect: in Envoy, `initial_metadata` of the RLQS
/// `grpc_service`.
pub(crate) const CLIENT_HEADER: &str = "x-tollgate-client";

/// The gRPC service around [`Quotas`].
#[derive(Debug, Clone)]
pub(crate) struct RlqsService {
    quotas: Arc<Quotas>,
}

impl RlqsService {
    /// Serves `quotas`.
    pub(crate) fn new(quotas: Arc<Quotas>) -> Self {
        Self { quotas }
    }

    /// The HTTP/2 service, refusing messages above `max_message_bytes`.
    pub(crate) fn into_server(self, max_message_bytes: usize) -> server::QuotaServer {
        server::QuotaServer::new(self, max_message_bytes)
    }
}

/// Forgets a stream however its task ends.
struct Closing(Arc<Quotas>, u64);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.close(self.1, self.0.now());
    }
}

/// The gRPC status for a refusal (the edge: the quota service knows no
/// gRPC).
impl From<QuotaError> for Status {
    fn from(error: QuotaError) -> Self {
        let message = error.to_string();
        match error {
            QuotaError::TooManyStreams { .. } => Status::resource_exhausted(message),
            QuotaError::StreamClosed => Status::internal(message),
            QuotaError::NoDomain
            | QuotaError::DomainTooLong { .. }
            | QuotaError::OtherDomain { .. } => Status::invalid_argument(message),
        }
    }
}

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Outbound;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Outbound>, Status> {
        let client = request
            .metadata()
            .get(CLIENT_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty());
        let (id, inbox) = self.quotas.open(client)?;
        let reply = self.quotas.sender(id);
        let quotas = self.quotas.clone();
        let idle = quotas.options().idle_timeout;
        let (end, ended) = oneshot::channel();
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            let _closing = Closing(quotas.clone(), id);
            let Some(reply) = reply else {
                return;
            };
            loop {
                let reports = match tokio::time::timeout(idle, inbound.message()).await {
                    Ok(Ok(Some(reports))) => reports,
                    // The client closed its side, or the connection went.
                    Ok(Ok(None) | Err(_)) => return,
                    Err(_) => {
                        let _ = end.send(Status::deadline_exceeded(format!(
                            "no usage report for {idle:?} (--rlqs-idle-timeout)"
                        )));
                        return;
                    }
                };
                match quotas.answer(id, &reports) {
                    Ok(answer) => {
                        if !reply.push(answer) {
                            quotas.metrics.streams_ended.fetch_add(1, Ordering::Relaxed);
                            let _ = end.send(Status::resource_exhausted(
                                "the stream does not read its answers: more than \
                                 --rlqs-max-queued-bytes are waiting",
                            ));
                            return;
                        }
                    }
                    Err(error) => {
                        let _ = end.send(error.into());
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Outbound::new(inbox, ended)))
    }
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
