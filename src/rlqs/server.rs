//! The quota service on HTTP/2: tonic's streaming server with a decoder
//! that reads usage reports whatever the bytes of their text.
//!
//! A bucket is a map of strings that Envoy's `bucket_matchers` build, often
//! from request headers, copied byte for byte; protobuf's `string` must be
//! UTF-8, so prost would end the whole stream (every bucket of that Envoy)
//! on one client's header. The domain and each bucket's keys and values are
//! read here as bytes (the same wire type) and made text by
//! [`crate::wire_text::from_wire`], losslessly.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Status, Streaming};

use super::RlqsService;
use super::outbox::Outbound;
use crate::wire_text::{BytesPair as Pair, from_wire, is_marked, to_wire};

type Reply = http::Response<tonic::body::Body>;
type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// The one method's full path.
const STREAM: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// The quota service as an HTTP service.
#[derive(Debug, Clone)]
pub(crate) struct QuotaServer {
    service: Arc<RlqsService>,
    max_message_bytes: usize,
}

impl QuotaServer {
    pub(super) fn new(service: RlqsService, max_message_bytes: usize) -> Self {
        Self {
            service: Arc::new(service),
            max_message_bytes,
        }
    }
}

impl<B> tower_service::Service<http::Request<B>> for QuotaServer
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = Reply;
    type Error = Infallible;
    type Future = BoxFuture<Reply, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != STREAM {
            let path = request.uri().path().to_owned();
            return Box::pin(async move {
                Ok(Status::unimplemented(format!("unknown method {path}")).into_http())
            });
        }
        let method = Method(self.service.clone());
        let max = self.max_message_bytes;
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(Lossless).apply_max_message_size_config(Some(max), None);
            Ok(grpc.streaming(method, request).await)
        })
    }
}

/// StreamRateLimitQuotas, as tonic's server calls it.
struct Method(Arc<RlqsService>);

impl tonic::server::StreamingService<RateLimitQuotaUsageReports> for Method {
    type Response = RateLimitQuotaResponse;
    type ResponseStream = Outbound;
    type Future = BoxFuture<tonic::Response<Outbound>, Status>;

    fn call(
        &mut self,
        request: tonic::Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.stream_rate_limit_quotas(request).await })
    }
}

/// Reports read losslessly; answers name each bucket by the bytes its
/// report sent.
#[derive(Debug, Clone, Copy, Default)]
struct Lossless;

impl Codec for Lossless {
    type Encode = RateLimitQuotaResponse;
    type Decode = RateLimitQuotaUsageReports;
    type Encoder = Lossless;
    type Decoder = Lossless;

    fn encoder(&mut self) -> Self::Encoder {
        Lossless
    }

    fn decoder(&mut self) -> Self::Decoder {
        Lossless
    }
}

impl Encoder for Lossless {
    type Item = RateLimitQuotaResponse;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        encode(item, buf);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// Writes `response` as prost does, except that a bucket's keys and values
/// made from bytes that were not UTF-8 are written as those bytes (Envoy
/// finds its bucket by them).
fn encode(response: RateLimitQuotaResponse, out: &mut impl bytes::BufMut) {
    let all_text = response.bucket_action.iter().all(|a| {
        a.bucket_id
            .as_ref()
            .is_none_or(|b| b.bucket.iter().all(|(k, v)| !is_marked(k) && !is_marked(v)))
    });
    if all_text {
        // Writing to a growable buffer cannot run out of room.
        let _ = response.encode(out);
        return;
    }
    for mut action in response.bucket_action {
        let mut id = Vec::new();
        for (key, value) in action
            .bucket_id
            .take()
            .map(|b| b.bucket)
            .unwrap_or_default()
        {
            let pair = Pair {
                key: to_wire(&key).into_owned(),
                value: to_wire(&value).into_owned(),
            };
            prost::encoding::message::encode(1, &pair, &mut id);
        }
        // The bucket id (field 1), then the rest of the action as prost
        // writes it (fields may come in any order; prost writes them in
        // number order, and so does this).
        let mut whole = Vec::new();
        prost::encoding::bytes::encode(1, &id, &mut whole);
        let _ = action.encode(&mut whole);
        prost::encoding::bytes::encode(1, &whole, out);
    }
}

impl Decoder for Lossless {
    type Item = RateLimitQuotaUsageReports;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let raw = Reports::decode(buf).map_err(|e| {
            Status::invalid_argument(format!("message is not a RateLimitQuotaUsageReports: {e}"))
        })?;
        Ok(Some(raw.into()))
    }
}

/// `RateLimitQuotaUsageReports`, its text as bytes.
#[derive(Clone, PartialEq, Message)]
struct Reports {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    bucket_quota_usages: Vec<Usage>,
}

/// `BucketQuotaUsage`.
#[derive(Clone, PartialEq, Message)]
struct Usage {
    #[prost(message, optional, tag = "1")]
    bucket_id: Option<Bucket>,
    #[prost(message, optional, tag = "2")]
    time_elapsed: Option<PbDuration>,
    #[prost(uint64, tag = "3")]
    num_requests_allowed: u64,
    #[prost(uint64, tag = "4")]
    num_requests_denied: u64,
}

/// `BucketId`: its map, as the wire holds it (one message per pair).
#[derive(Clone, PartialEq, Message)]
struct Bucket {
    #[prost(message, repeated, tag = "1")]
    bucket: Vec<Pair>,
}

impl From<Reports> for RateLimitQuotaUsageReports {
    fn from(raw: Reports) -> Self {
        Self {
            domain: from_wire(raw.domain),
            bucket_quota_usages: raw
                .bucket_quota_usages
                .into_iter()
                .map(|u| BucketQuotaUsage {
                    bucket_id: u.bucket_id.map(|b| BucketId {
                        // A map: a key given twice keeps its last value.
                        bucket: b
                            .bucket
                            .into_iter()
                            .map(|p| (from_wire(p.key), from_wire(p.value)))
                            .collect::<HashMap<_, _>>(),
                    }),
                    time_elapsed: u.time_elapsed,
                    num_requests_allowed: u.num_requests_allowed,
                    num_requests_denied: u.num_requests_denied,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
        AbandonAction, BucketAction as Action,
    };

    use super::*;

    fn usage(pairs: &[(&[u8], &[u8])]) -> Usage {
        Usage {
            bucket_id: Some(Bucket {
                bucket: pairs
                    .iter()
                    .map(|(k, v)| Pair {
                        key: k.to_vec(),
                        value: v.to_vec(),
                    })
                    .collect(),
            }),
            time_elapsed: Some(PbDuration {
                seconds: 2,
                nanos: 0,
            }),
            num_requests_allowed: 5,
            num_requests_denied: 1,
        }
    }

    #[test]
    fn reports_read_as_prost_reads_them_and_other_bytes_losslessly() {
        let sent = RateLimitQuotaUsageReports {
            domain: "quota".into(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [("user".to_owned(), "zoë".to_owned())].into(),
                }),
                time_elapsed: Some(PbDuration {
                    seconds: 3,
                    nanos: 7,
                }),
                num_requests_allowed: 9,
                num_requests_denied: 2,
            }],
        };
        let read: RateLimitQuotaUsageReports = Reports::decode(sent.encode_to_vec().as_slice())
            .expect("decodes")
            .into();
        assert_eq!(read, sent);

        let raw = Reports {
            domain: b"quota".to_vec(),
            bucket_quota_usages: vec![
                usage(&[(b"user", b"mallory\xff")]),
                usage(&[(b"user", b"a"), (b"user", b"b")]),
            ],
        };
        let bytes = raw.encode_to_vec();
        assert!(
            RateLimitQuotaUsageReports::decode(bytes.as_slice()).is_err(),
            "prost itself refuses it"
        );
        let read: RateLimitQuotaUsageReports =
            Reports::decode(bytes.as_slice()).expect("decodes").into();
        let bucket = |i: usize| {
            &read.bucket_quota_usages[i]
                .bucket_id
                .as_ref()
                .expect("id")
                .bucket
        };
        assert_eq!(bucket(0)["user"], "\u{FFFD}mallory\\xff");
        assert_eq!(bucket(1)["user"], "b", "a map keeps a key's last value");
        assert_eq!(read.bucket_quota_usages[0].num_requests_allowed, 5);
    }

    fn action(pairs: &[(&str, &str)]) -> BucketAction {
        BucketAction {
            bucket_id: Some(BucketId {
                bucket: pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            }),
            bucket_action: Some(Action::AbandonAction(AbandonAction {})),
        }
    }

    #[test]
    fn answers_name_a_bucket_by_the_bytes_its_report_sent() {
        let plain = RateLimitQuotaResponse {
            bucket_action: vec![action(&[("user", "zoë")]), action(&[])],
        };
        let mut out = Vec::new();
        encode(plain.clone(), &mut out);
        assert_eq!(
            out,
            plain.encode_to_vec(),
            "text is written as prost writes it"
        );

        let sent = from_wire(b"mallory\xff".to_vec());
        let escaped = RateLimitQuotaResponse {
            bucket_action: vec![action(&[("user", &sent)]), action(&[("user", "ann")])],
        };
        let mut out = Vec::new();
        encode(escaped, &mut out);
        // Read back as a client would, its text as bytes.
        #[derive(Clone, PartialEq, Message)]
        struct RawAction {
            #[prost(message, optional, tag = "1")]
            bucket_id: Option<Bucket>,
            #[prost(message, optional, tag = "3")]
            abandon: Option<AbandonAction>,
        }
        #[derive(Clone, PartialEq, Message)]
        struct RawResponse {
            #[prost(message, repeated, tag = "1")]
            bucket_action: Vec<RawAction>,
        }
        let read = RawResponse::decode(out.as_slice()).expect("decodes");
        let pair =
            |i: usize| read.bucket_action[i].bucket_id.as_ref().expect("id").bucket[0].clone();
        assert_eq!(pair(0).value, b"mallory\xff");
        assert_eq!(pair(1).value, b"ann");
        assert!(read.bucket_action.iter().all(|a| a.abandon.is_some()));
    }
}
