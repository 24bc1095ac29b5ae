//! A `RateLimitRequest` read from the wire whatever the bytes of its text
//! fields.
//!
//! prost refuses a `string` field that is not UTF-8, and a refused request
//! is one Envoy lets through (`failure_mode_deny: false`, its default): a
//! client who sends `x-user: mallory\xff` would never be limited. The
//! domain, keys and values are read here as bytes (the same wire type) and
//! made text by [`crate::wire_text::from_wire`], losslessly.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use prost::Message;

use crate::wire_text::{BytesPair as Pair, from_wire};

/// `envoy.service.ratelimit.v3.RateLimitRequest`, its text as bytes.
#[derive(Clone, PartialEq, Message)]
struct Request {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<Descriptor>,
    #[prost(uint32, tag = "3")]
    hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, Message)]
struct Descriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<Pair>,
    #[prost(message, optional, tag = "2")]
    limit: Option<RateLimitOverride>,
    #[prost(message, optional, tag = "3")]
    hits_addend: Option<UInt64Value>,
    #[prost(bool, tag = "4")]
    is_negative_hits: bool,
}

/// The request in `message`, its text made lossless; an error only for a
/// message that is not a protobuf of this shape.
pub(super) fn request(message: bytes::Bytes) -> Result<RateLimitRequest, prost::DecodeError> {
    let raw = Request::decode(message)?;
    Ok(RateLimitRequest {
        domain: from_wire(raw.domain),
        descriptors: raw
            .descriptors
            .into_iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: from_wire(e.key),
                        value: from_wire(e.value),
                    })
                    .collect(),
                limit: d.limit,
                hits_addend: d.hits_addend,
                is_negative_hits: d.is_negative_hits,
            })
            .collect(),
        hits_addend: raw.hits_addend,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(domain: &[u8], entries: &[(&[u8], &[u8])]) -> bytes::Bytes {
        Request {
            domain: domain.to_vec(),
            descriptors: vec![Descriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Pair {
                        key: k.to_vec(),
                        value: v.to_vec(),
                    })
                    .collect(),
                limit: None,
                hits_addend: Some(UInt64Value { value: 3 }),
                is_negative_hits: false,
            }],
            hits_addend: 2,
        }
        .encode_to_vec()
        .into()
    }

    #[test]
    fn utf8_requests_read_as_prost_reads_them() {
        let sent = RateLimitRequest {
            domain: "web".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: "zoë".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 7,
                    unit: 2,
                }),
                hits_addend: Some(UInt64Value { value: 4 }),
                is_negative_hits: true,
            }],
            hits_addend: 9,
        };
        let read = request(sent.encode_to_vec().into()).expect("decodes");
        assert_eq!(read, sent);
    }

    #[test]
    fn bytes_that_are_not_utf8_are_read_not_refused() {
        let message = wire(b"we\xffb", &[(b"x-user\xc3", b"mallory\xff")]);
        assert!(
            RateLimitRequest::decode(message.clone()).is_err(),
            "prost itself refuses it"
        );
        let read = request(message).expect("decodes");
        assert_eq!(read.domain, "\u{FFFD}we\\xffb");
        assert_eq!(read.descriptors[0].entries[0].key, "\u{FFFD}x-user\\xc3");
        assert_eq!(read.descriptors[0].entries[0].value, "\u{FFFD}mallory\\xff");
        assert_eq!(
            read.descriptors[0].hits_addend,
            Some(UInt64Value { value: 3 })
        );
        assert_eq!(read.hits_addend, 2);
    }

    #[test]
    fn a_message_that_is_not_protobuf_is_still_an_error() {
        assert!(request(bytes::Bytes::from_static(b"\xff\xff\xff")).is_err());
    }
}
