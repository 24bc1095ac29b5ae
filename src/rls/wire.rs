//! A decision written straight to the wire as a `RateLimitResponse`.
//!
//! Building the prost message first costs a vector per response and a
//! string per limit name and header, all dropped once encoded, and prost
//! computes a nested message's length again at every level above it: on the
//! memory store about as much as the decision itself. This writes the same bytes prost writes for
//! [`super::to_proto`] (fields in number order, proto3 defaults left out;
//! a test compares the two on generated decisions), from the decision as it
//! is.

use crate::clock::Nanos;
use crate::limiter::{AppliedLimit, Decision, DescriptorStatus};

use super::{duration, unit_to_proto};

/// Wire types.
const VARINT: u8 = 0;
const LEN: u8 = 2;

/// `RateLimitResponse.Code`, as a varint.
fn code(over_limit: bool) -> u64 {
    super::code(over_limit) as u64
}

fn varint_len(v: u64) -> usize {
    // 7 bits per byte; 0 still takes one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Field numbers here are all below 16: a tag is one byte.
fn put_tag(out: &mut Vec<u8>, field: u8, wire: u8) {
    out.push(field << 3 | wire);
}

/// A varint field, left out when zero (proto3).
fn varint_field_len(v: u64) -> usize {
    if v == 0 { 0 } else { 1 + varint_len(v) }
}

fn put_varint_field(out: &mut Vec<u8>, field: u8, v: u64) {
    if v != 0 {
        put_tag(out, field, VARINT);
        put_varint(out, v);
    }
}

/// A length-delimited field of `len` bytes, tag and length included.
fn len_field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn put_len_header(out: &mut Vec<u8>, field: u8, len: usize) {
    put_tag(out, field, LEN);
    put_varint(out, len as u64);
}

/// A string field, left out when empty (proto3).
fn string_field_len(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        len_field_len(s.len())
    }
}

fn put_string_field(out: &mut Vec<u8>, field: u8, s: &str) {
    if !s.is_empty() {
        put_len_header(out, field, s.len());
        out.extend_from_slice(s.as_bytes());
    }
}

/// `RateLimit`: requests_per_unit = 1, unit = 2, name = 3.
fn limit_len(l: &AppliedLimit) -> usize {
    varint_field_len(u64::from(l.requests_per_unit))
        + varint_field_len(unit_to_proto(l.unit) as u64)
        + string_field_len(&l.name)
}

/// `google.protobuf.Duration`: seconds = 1, nanos = 2 (both from a
/// `Nanos`, so never negative).
fn duration_parts(n: Nanos) -> (u64, u64) {
    let d = duration(n);
    (d.seconds as u64, d.nanos as u64)
}

fn duration_len(n: Nanos) -> usize {
    let (seconds, nanos) = duration_parts(n);
    varint_field_len(seconds) + varint_field_len(nanos)
}

/// A status's limit with the lengths of its two messages: the limit's and
/// the reset's (sent with a limit only, as `to_proto` does).
type Nested<'a> = Option<(&'a AppliedLimit, usize, usize)>;

fn nested(s: &DescriptorStatus) -> Nested<'_> {
    s.limit
        .as_ref()
        .map(|l| (l, limit_len(l), duration_len(s.reset)))
}

/// `DescriptorStatus`: code = 1, current_limit = 2, limit_remaining = 3,
/// duration_until_reset = 4.
fn status_len(s: &DescriptorStatus, nested: Nested<'_>) -> usize {
    varint_field_len(code(s.over_limit))
        + varint_field_len(u64::from(s.remaining))
        + nested.map_or(0, |(_, limit, reset)| {
            len_field_len(limit) + len_field_len(reset)
        })
}

/// `HeaderValue`: key = 1, value = 2.
fn header_len(key: &str, value: &str) -> usize {
    string_field_len(key) + string_field_len(value)
}

/// The encoded length of the decision's `RateLimitResponse`.
pub(crate) fn encoded_len(d: &Decision) -> usize {
    varint_field_len(code(d.over_limit))
        + d.statuses
            .iter()
            .map(|s| len_field_len(status_len(s, nested(s))))
            .sum::<usize>()
        + d.headers
            .iter()
            .map(|(k, v)| len_field_len(header_len(k, v)))
            .sum::<usize>()
}

/// Appends the decision's `RateLimitResponse` (overall_code = 1,
/// statuses = 2, response_headers_to_add = 3) to `out`.
pub(crate) fn encode(d: &Decision, out: &mut Vec<u8>) {
    put_varint_field(out, 1, code(d.over_limit));
    for s in &d.statuses {
        // Each nested length once per status.
        let nested = nested(s);
        put_len_header(out, 2, status_len(s, nested));
        put_varint_field(out, 1, code(s.over_limit));
        if let Some((l, limit_len, _)) = nested {
            put_len_header(out, 2, limit_len);
            put_varint_field(out, 1, u64::from(l.requests_per_unit));
            put_varint_field(out, 2, unit_to_proto(l.unit) as u64);
            put_string_field(out, 3, &l.name);
        }
        put_varint_field(out, 3, u64::from(s.remaining));
        if let Some((_, _, reset_len)) = nested {
            put_len_header(out, 4, reset_len);
            let (seconds, nanos) = duration_parts(s.reset);
            put_varint_field(out, 1, seconds);
            put_varint_field(out, 2, nanos);
        }
    }
    for (key, value) in &d.headers {
        put_len_header(out, 3, header_len(key, value));
        put_string_field(out, 1, key);
        put_string_field(out, 2, value);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::clock::NANOS_PER_SEC;
    use crate::limiter::LimitStatus;
    use crate::rules::Unit;

    fn unit() -> impl Strategy<Value = Unit> {
        prop_oneof![
            Just(Unit::Second),
            Just(Unit::Minute),
            Just(Unit::Hour),
            Just(Unit::Day),
            Just(Unit::Week),
            Just(Unit::Month),
            Just(Unit::Year),
        ]
    }

    fn limit() -> impl Strategy<Value = AppliedLimit> {
        (
            prop_oneof!["", "[a-z_]{1,12}", "\\PC{0,200}"],
            any::<u32>(),
            unit(),
            any::<bool>(),
        )
            .prop_map(|(name, requests_per_unit, unit, shadow)| AppliedLimit {
                policy: Arc::from(name.as_str()),
                name: Arc::from(name.as_str()),
                requests_per_unit,
                unit,
                window_seconds: 60,
                shadow,
                from_request: false,
                rule: None,
                scope: 0,
            })
    }

    fn status() -> impl Strategy<Value = DescriptorStatus> {
        (
            any::<bool>(),
            proptest::option::of(limit()),
            prop_oneof![Just(0u32), any::<u32>()],
            prop_oneof![
                Just(0u64),
                0..NANOS_PER_SEC,
                any::<u64>().prop_map(|n| n % (400 * 86_400 * NANOS_PER_SEC))
            ],
        )
            .prop_map(|(over_limit, limit, remaining, reset)| DescriptorStatus {
                over_limit,
                limit,
                remaining,
                reset,
                others: Vec::<LimitStatus>::new(),
            })
    }

    fn decision() -> impl Strategy<Value = Decision> {
        (
            any::<bool>(),
            proptest::collection::vec(status(), 0..5),
            proptest::collection::vec(
                (
                    prop_oneof![Just("ratelimit"), Just("retry-after")],
                    "\\PC{0,300}",
                ),
                0..3,
            ),
        )
            .prop_map(|(over_limit, statuses, headers)| Decision {
                over_limit,
                statuses,
                headers,
            })
    }

    proptest! {
        /// The same bytes as prost's encoding of `to_proto`, and the length
        /// said before writing is the length written.
        #[test]
        fn writes_what_prost_writes_for_to_proto(d in decision()) {
            let expected = super::super::to_proto(d.clone()).encode_to_vec();
            let mut out = Vec::new();
            encode(&d, &mut out);
            prop_assert_eq!(encoded_len(&d), out.len());
            prop_assert_eq!(out, expected);
        }
    }

    #[test]
    fn varint_lengths_at_every_boundary() {
        for bits in 0..64 {
            for v in [1u64 << bits, (1u64 << bits) - 1, (1u64 << bits) + 1] {
                let mut out = Vec::new();
                put_varint(&mut out, v);
                assert_eq!(varint_len(v), out.len(), "{v}");
            }
        }
        assert_eq!(varint_len(u64::MAX), 10);
    }
}
