//! What Envoy 1.40 does with an answer's extras (envoy/gateway.yaml, its
//! routes to a cluster): `raw_body` becomes the 429's body, labelled by
//! the answer's `content-type`; `request_headers_to_add` reaches the
//! upstream on an admitted request.

use std::net::SocketAddr;

use crate::common::Tollgate;
use crate::common::envoy::{Envoy, http};
use crate::common::redis::free_port;
use crate::common::upstream::Recorder;

/// The gateway's descriptors: anonymous traffic refused (a hard limit),
/// signed-in users tagged past theirs (a soft limit).
const RULES: &str = "domain: gateway
descriptors:
  - key: anonymous
    value: \"true\"
    descriptors:
      - key: remote_address
        rate_limit: {name: anonymous, unit: hour, requests_per_unit: 2}
  - key: user
    over_limit: tag
    rate_limit: {name: per-user-soft, unit: hour, requests_per_unit: 2}
";

/// envoy/gateway.yaml: its upstream cluster at `upstream` (the stand-in
/// listener moved out of the way), and, before the rate limit filter, the
/// header_mutation filter docs/rules.md advises, which drops a client's
/// own `x-tollgate-over-limit`.
fn gateway(tollgate_port: u16, upstream: SocketAddr) -> (Envoy, SocketAddr) {
    let (listen, stand_in, admin) = (free_port(), free_port(), free_port());
    let cluster_endpoint = format!(
        "- endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }} }}",
        upstream.port()
    );
    let strip = "- name: envoy.filters.http.header_mutation
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation
                      mutations:
                        request_mutations:
                          - remove: x-tollgate-over-limit
                  - name: envoy.filters.http.ratelimit";
    let envoy = Envoy::start_replacing(
        "gateway.yaml",
        &[
            (10000, listen),
            (10001, stand_in),
            (9901, admin),
            (8081, tollgate_port),
        ],
        &[
            (
                "- endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: 10001 } } }",
                &cluster_endpoint,
            ),
            ("- name: envoy.filters.http.ratelimit", strip),
        ],
        admin,
    );
    (envoy, SocketAddr::from(([127, 0, 0, 1], listen)))
}

#[test]
fn a_429_through_envoy_has_the_json_body_and_its_content_type() {
    let tollgate = Tollgate::start(RULES, &["--over-limit-body", "json"]);
    let upstream = Recorder::start();
    let (_envoy, addr) = gateway(tollgate.addr.port(), upstream.addr);
    for i in 0..2 {
        let r = http(addr, "GET", "/items", &[]).expect("answer");
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert_eq!(r.body, "ok\n", "from the upstream");
    }
    let refused = http(addr, "GET", "/items", &[]).expect("answer");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(
        refused.header("content-type"),
        Some("application/json"),
        "{refused:?}"
    );
    let retry: u64 = refused
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("retry-after");
    let body: serde_json::Value = serde_json::from_str(&refused.body).expect("a JSON body");
    assert_eq!(
        body,
        serde_json::json!({"error": "rate_limited", "retry_after_seconds": retry, "rule": "anonymous"})
    );
    assert_eq!(upstream.requests().len(), 2, "the refusal went nowhere");
}

#[test]
fn the_upstream_is_told_which_soft_limits_a_request_is_over() {
    let tollgate = Tollgate::start(RULES, &[]);
    let upstream = Recorder::start();
    let (envoy, addr) = gateway(tollgate.addr.port(), upstream.addr);
    let user = [("x-user-id", "alice")];
    for i in 0..2 {
        let r = http(addr, "GET", "/items", &user).expect("answer");
        assert_eq!(r.status, 200, "request {i}: {r:?}");
    }
    // A client's own tag is dropped before the rate limit filter.
    let spoofed = [
        ("x-user-id", "alice"),
        ("x-tollgate-over-limit", "someone-else"),
    ];
    for i in 2..4 {
        let r = http(addr, "GET", "/items", &spoofed).expect("answer");
        assert_eq!(
            r.status, 200,
            "request {i}, over a soft limit, admitted: {r:?}"
        );
    }
    assert_eq!(upstream.requests().len(), 4);
    for i in 0..2 {
        assert!(
            upstream.values(i, "x-tollgate-over-limit").is_empty(),
            "request {i} was within the limit: {:?}",
            upstream.requests()[i]
        );
    }
    for i in 2..4 {
        assert_eq!(
            upstream.values(i, "x-tollgate-over-limit"),
            ["per-user-soft"],
            "request {i}: {:?}",
            upstream.requests()[i]
        );
    }
    assert_eq!(envoy.stat("cluster.upstream.ratelimit.over_limit"), 0);
    assert_eq!(
        tollgate.metric(r#"ratelimit_service_rate_limit_over_limit{domain="gateway",key1="user"}"#),
        2
    );
}
