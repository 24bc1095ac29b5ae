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

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

mod bucket;
mod options;
mod quotas;
pub mod share;
mod sync;
mod view;
mod wire;

pub use options::{
    COUNTED_PERIOD_SECONDS, DEMAND_STALE, MAX_CLIENT_NAME, MAX_DEPARTED, QuotaOptions, Unmatched,
};
pub use quotas::{QuotaMetrics, Quotas};
pub use wire::Outgoing;

/// The start of every gRPC path of the quota service (the server dispatches
/// on it, and holds its streams' connections busy while they last).
pub const SERVICE_PATH: &str = "/envoy.service.rate_limit_quota.v3.";

/// The request header (gRPC metadata) a client may name itself with, so its
/// share survives a reconnect: in Envoy, `initial_metadata` of the RLQS
/// `grpc_service`.
pub const CLIENT_HEADER: &str = "x-tollgate-client";

/// The gRPC service around [`Quotas`].
#[derive(Debug, Clone)]
pub struct RlqsService {
    quotas: Arc<Quotas>,
}

impl RlqsService {
    /// Serves `quotas`.
    pub fn new(quotas: Arc<Quotas>) -> Self {
        Self { quotas }
    }

    /// The HTTP/2 service, refusing messages above `max_message_bytes`.
    pub fn into_server(self, max_message_bytes: usize) -> RateLimitQuotaServiceServer<Self> {
        RateLimitQuotaServiceServer::new(self).max_decoding_message_size(max_message_bytes)
    }
}

/// What a stream sends: assignments answering its reports, and pushes.
#[derive(Debug)]
pub struct Outbound(mpsc::Receiver<Outgoing>);

impl futures_util::Stream for Outbound {
    type Item = Outgoing;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Outgoing>> {
        self.0.poll_recv(cx)
    }
}

/// Forgets a stream however its task ends.
struct Closing(Arc<Quotas>, u64);

impl Drop for Closing {
    fn drop(&mut self) {
        self.0.close(self.1);
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
        let (id, rx) = self.quotas.open(client)?;
        let reply = self.quotas.sender(id);
        let quotas = self.quotas.clone();
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            let _closing = Closing(quotas.clone(), id);
            let Some(reply) = reply else {
                return;
            };
            loop {
                let reports = match inbound.message().await {
                    Ok(Some(reports)) => reports,
                    // The client closed its side, or the connection went.
                    Ok(None) | Err(_) => return,
                };
                let answer: Outgoing = quotas.report(id, &reports);
                let failed = answer.is_err();
                if reply.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Outbound(rx)))
    }
}

#[cfg(test)]
mod tests;
