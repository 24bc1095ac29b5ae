//! A `RateLimitRequest` read from the wire whatever the bytes of its text
//! fields.
//!
//! prost refuses a `string` field that is not UTF-8, and a refused request
//! is one Envoy lets through (`failure_mode_deny: false`, its default): a
//! client who sends `x-user: mallory\xff` would never be limited. A request
//! prost refuses is read again here with the domain, keys and values as
//! bytes (the same wire type), made text by
//! [`crate::wire_text::from_wire`], losslessly. (Such a request is decoded
//! twice, at most `--max-request-bytes` each: the price is the hostile
//! client's, not every caller's.)

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;

use crate::wire_text::from_wire;

/// The messages with their text as bytes, under the proto's own names (a
/// decoding error names the message it is in: "RateLimitRequest.descriptors").
mod as_bytes {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use envoy_types::pb::google::protobuf::UInt64Value;

    use crate::wire_text::BytesPair as Pair;

    /// `envoy.service.ratelimit.v3.RateLimitRequest`, its text as bytes.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct RateLimitRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub(super) domain: Vec<u8>,
        #[prost(message, repeated, tag = "2")]
        pub(super) descriptors: Vec<RateLimitDescriptor>,
        #[prost(uint32, tag = "3")]
        pub(super) hits_addend: u32,
    }

    /// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct RateLimitDescriptor {
        #[prost(message, repeated, tag = "1")]
        pub(super) entries: Vec<Pair>,
        #[prost(message, optional, tag = "2")]
        pub(super) limit: Option<RateLimitOverride>,
        #[prost(message, optional, tag = "3")]
        pub(super) hits_addend: Option<UInt64Value>,
        #[prost(bool, tag = "4")]
        pub(super) is_negative_hits: bool,
    }
}

/// The request in `message`, its text made lossless; an error only for a
/// message that is not a protobuf of this shape.
pub(super) fn request(message: bytes::Bytes) -> Result<RateLimitRequest, prost::DecodeError> {
    // Nearly every request is UTF-8 throughout, and then prost's own
    // strings are what `from_wire` makes of the same bytes once a text
    // beginning with the marker is escaped: read that way first, which
    // costs about 120 instructions a call less than reading bytes and
    // making each one text. A request prost refuses is read again as bytes.
    match RateLimitRequest::decode(message.clone()) {
        Ok(mut read) => {
            as_sent(&mut read);
            Ok(read)
        }
        Err(_) => lossless(message),
    }
}

/// `request`'s texts (UTF-8, as protobuf strings are) made what
/// `from_wire` makes of the same bytes sent: a text beginning with the
/// marker is escaped, the rest kept as it is. Also how `/json` reads its
/// texts, so it cannot name the counter of a client whose bytes were not
/// UTF-8 (gRPC cannot either).
pub(crate) fn as_sent(request: &mut RateLimitRequest) {
    let read = |text: &mut String| {
        if crate::wire_text::is_marked(text) {
            *text = from_wire(std::mem::take(text).into_bytes());
        }
    };
    read(&mut request.domain);
    for entry in request
        .descriptors
        .iter_mut()
        .flat_map(|d| d.entries.iter_mut())
    {
        read(&mut entry.key);
        read(&mut entry.value);
    }
}

/// The request in `message`, every text read as bytes and made text by
/// `from_wire`.
fn lossless(message: bytes::Bytes) -> Result<RateLimitRequest, prost::DecodeError> {
    let raw = as_bytes::RateLimitRequest::decode(message)?;
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
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::*;
    use crate::wire_text::BytesPair as Pair;

    fn wire(domain: &[u8], entries: &[(&[u8], &[u8])]) -> bytes::Bytes {
        as_bytes::RateLimitRequest {
            domain: domain.to_vec(),
            descriptors: vec![as_bytes::RateLimitDescriptor {
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
    fn a_utf8_text_that_begins_with_the_marker_is_made_text_as_bytes_are() {
        // Valid UTF-8 that prost reads, but `from_wire` escapes: both ways
        // to the same text, so the counter is the same whichever way ran.
        let message = wire(
            "\u{FFFD}web".as_bytes(),
            &[(b"user", "\u{FFFD}x\\".as_bytes())],
        );
        let read = request(message).expect("decodes");
        assert_eq!(read.domain, from_wire("\u{FFFD}web".as_bytes().to_vec()));
        assert_eq!(
            read.descriptors[0].entries[0].value,
            from_wire("\u{FFFD}x\\".as_bytes().to_vec())
        );
        assert_ne!(read.descriptors[0].entries[0].value, "\u{FFFD}x\\");
        assert_eq!(read.descriptors[0].entries[0].key, "user");
        assert_eq!(
            lossless(wire(b"api", &[(b"k", b"v")])),
            request(wire(b"api", &[(b"k", b"v")]))
        );
    }

    #[test]
    fn a_message_that_is_not_protobuf_is_still_an_error() {
        assert!(request(bytes::Bytes::from_static(b"\xff\xff\xff")).is_err());
        // Cut short: the error names the proto's message and field.
        let whole = wire(b"api", &[(b"user", b"a\xff")]);
        let cut = request(whole.slice(..whole.len() - 4)).expect_err("cut short");
        assert!(
            cut.to_string().contains("RateLimitRequest.descriptors"),
            "{cut}"
        );
    }
}
