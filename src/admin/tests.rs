use super::json::{request_from_json, response_to_json};

#[test]
fn requests_parse_in_both_spellings_and_refuse_unknown_fields() {
    let r = request_from_json(
        br#"{"domain":"d","hitsAddend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],
            "limit":{"requests_per_unit":"5","unit":"MINUTE"},"hits_addend":"3"}]}"#,
    )
    .expect("parses");
    assert_eq!(r.domain, "d");
    assert_eq!(r.hits_addend, 2);
    assert_eq!(r.descriptors[0].entries[0].value, "v");
    assert_eq!(
        r.descriptors[0]
            .limit
            .map(|l| (l.requests_per_unit, l.unit)),
        Some((5, 2))
    );
    assert_eq!(r.descriptors[0].hits_addend.map(|h| h.value), Some(3));
    let err = request_from_json(br#"{"domain":"d","descriptor":[]}"#).expect_err("unknown field");
    assert!(err.contains("descriptor"), "{err}");
    let err = request_from_json(b"{").expect_err("bad JSON");
    assert!(err.contains("invalid JSON"), "{err}");
    let err = request_from_json(br#"{"descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#)
        .expect_err("bad unit");
    assert!(err.contains("FORTNIGHT"), "{err}");
}

#[test]
fn responses_use_enum_names_and_durations() {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        DescriptorStatus, RateLimit,
    };
    let r = RateLimitResponse {
        overall_code: 2,
        statuses: vec![DescriptorStatus {
            code: 2,
            current_limit: Some(RateLimit {
                name: "n".into(),
                requests_per_unit: 5,
                unit: 2,
            }),
            limit_remaining: 0,
            duration_until_reset: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: 1,
                nanos: 500_000_000,
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let v = response_to_json(&r);
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    assert_eq!(v["statuses"][0]["durationUntilReset"], "1.500s");
    assert!(v.get("requestHeadersToAdd").is_none(), "none, none shown");
}

#[test]
fn a_soft_limits_request_header_is_shown() {
    use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
    let r = RateLimitResponse {
        overall_code: 1,
        request_headers_to_add: vec![HeaderValue {
            key: "x-tollgate-over-limit".into(),
            value: "per-user-soft".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let v = response_to_json(&r);
    assert_eq!(v["requestHeadersToAdd"][0]["key"], "x-tollgate-over-limit");
    assert_eq!(v["requestHeadersToAdd"][0]["value"], "per-user-soft");
}
