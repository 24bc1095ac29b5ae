//! The answer written by hand (wire.rs) against what prost writes for the
//! same answer, the rule's naming entries kept per thread, and the
//! varint lengths.

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
            soft: !shadow && requests_per_unit % 2 == 0,
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
            tagged: !over_limit && limit.as_ref().is_some_and(|l| l.soft),
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
        proptest::collection::vec(
            (Just(crate::limiter::OVER_LIMIT_HEADER), "\\PC{0,300}"),
            0..2,
        ),
        proptest::option::of(prop_oneof!["", "\\PC{0,300}"]),
    )
        .prop_map(
            |(over_limit, statuses, headers, request_headers, body)| Decision {
                over_limit,
                statuses,
                headers,
                request_headers,
                body,
                deciding: None,
            },
        )
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

/// Each thread keeps the naming entries of the rules it answered for:
/// more rules than it keeps, answered in turns, and a reload's rules
/// of the same paths, are each named by their own entries.
#[test]
fn each_rule_is_named_by_its_own_entries_whatever_was_answered_before() {
    let yaml: String = (0..200)
        .map(|i| {
            format!(
                "  - key: k{i}\n    rate_limit: {{unit: minute, requests_per_unit: {}}}\n",
                i + 1
            )
        })
        .collect();
    let load = || {
        crate::rules::RuleSet::from_yaml(&format!("domain: d\ndescriptors:\n{yaml}"))
            .expect("rules")
    };
    let (old, reloaded) = (load(), load());
    for _ in 0..2 {
        for rules in [&old, &reloaded] {
            for rule in rules.rules() {
                let decision = Decision {
                    over_limit: false,
                    statuses: Vec::new(),
                    headers: Vec::new(),
                    request_headers: Vec::new(),
                    body: None,
                    deciding: Some(Deciding {
                        rule: rule.clone(),
                        remaining: 3,
                    }),
                };
                let mut out = Vec::new();
                encode(&decision, &mut out);
                assert_eq!(encoded_len(&decision), out.len());
                let mut own = Vec::new();
                put_named(&mut own, rule);
                assert!(
                    out.windows(own.len()).any(|w| w == own.as_slice()),
                    "{} is not named by its own entries",
                    rule.path
                );
            }
        }
    }
}

#[test]
fn the_deciding_rule_is_written_as_envoys_dynamic_metadata() {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use envoy_types::pb::google::protobuf::value::Kind;
    let rules = crate::rules::RuleSet::from_yaml(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {name: per-user, unit: minute, requests_per_unit: 5}\n",
    )
    .expect("rules");
    let decision = Decision {
        over_limit: true,
        statuses: Vec::new(),
        headers: vec![("retry-after", "7".into())],
        request_headers: Vec::new(),
        body: None,
        deciding: Some(Deciding {
            rule: rules.rules()[0].clone(),
            remaining: 0,
        }),
    };
    let mut out = Vec::new();
    encode(&decision, &mut out);
    assert_eq!(encoded_len(&decision), out.len());
    let read = RateLimitResponse::decode(out.as_slice()).expect("prost reads it");
    let fields = read.dynamic_metadata.expect("metadata").fields;
    let text = |k: &str| match fields.get(k).and_then(|v| v.kind.clone()) {
        Some(Kind::StringValue(s)) => s,
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(text("rule"), "api.user");
    assert_eq!(text("name"), "per-user");
    assert!(text("source").ends_with(":3"), "{}", text("source"));
    assert_eq!(
        fields.get("remaining").and_then(|v| v.kind.clone()),
        Some(Kind::NumberValue(0.0))
    );
    assert_eq!(read.response_headers_to_add.len(), 1);
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
