//! End to end through a real Envoy: the configurations in envoy/ are loaded
//! by Envoy, and HTTP and TCP traffic through them is limited by a real
//! `tollgate serve` (memory store, or Redis shared by two gateways).

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::common::Tollgate;
use crate::common::envoy::{Envoy, http, validate};
use crate::common::redis::{RedisServer, free_port};

/// The gateway's rules with small numbers, same descriptors as
/// examples/rules/gateway.yaml.
const GATEWAY_RULES: &str = "domain: gateway
descriptors:
  - key: anonymous
    value: \"true\"
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 3}
  - key: user
    rate_limit: {name: per-user, unit: hour, requests_per_unit: 2}
  - key: org
    rate_limit: {name: per-org, unit: hour, requests_per_unit: 5}
  - key: plan
    value: free
    descriptors:
      - key: api_key
        rate_limit: {unit: hour, requests_per_unit: 60, algorithm: token_bucket, burst: 2}
  - key: path
    value: /login
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 2, failure_mode: deny}
  - key: path
    value: /search
    descriptors:
      - key: remote_address
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 1}
";

struct Gateway {
    envoy: Envoy,
    addr: SocketAddr,
}

fn gateway(config: &str, tollgate_port: u16) -> Gateway {
    let (listen, upstream, admin) = (free_port(), free_port(), free_port());
    let (from_listen, from_upstream, from_admin) = match config {
        "gateway.yaml" => (10000, 10001, 9901),
        "tcp.yaml" => (10100, 10101, 9902),
        "egress.yaml" => (10200, 10201, 9903),
        other => panic!("unknown config {other}"),
    };
    let envoy = Envoy::start(
        config,
        &[
            (from_listen, listen),
            (from_upstream, upstream),
            (from_admin, admin),
            (8081, tollgate_port),
        ],
        admin,
    );
    Gateway {
        envoy,
        addr: SocketAddr::from(([127, 0, 0, 1], listen)),
    }
}

fn get(g: &Gateway, path: &str, headers: &[(&str, &str)]) -> crate::common::envoy::Response {
    http(g.addr, "GET", path, headers).expect("gateway answers")
}

#[test]
fn every_envoy_configuration_is_valid() {
    // mtls.yaml names certificate files that exist only in its own test
    // (envoy_reaches_tollgate_over_mutual_tls), which runs it live.
    for config in ["gateway.yaml", "tcp.yaml", "egress.yaml", "llm-budget.yaml"] {
        let (ok, output) = validate(config);
        assert!(ok, "{config}: {output}");
        assert!(output.contains("OK"), "{config}: {output}");
    }
}

#[test]
fn anonymous_traffic_is_limited_with_headers_from_envoy_and_tollgate() {
    let tollgate = Tollgate::start(GATEWAY_RULES, &[]);
    let g = gateway("gateway.yaml", tollgate.addr.port());
    for i in 0..3 {
        let r = get(&g, "/items", &[]);
        assert_eq!(r.status, 200, "request {i}: {r:?}");
        assert_eq!(
            r.header("x-ratelimit-limit").map(|v| v.starts_with('3')),
            Some(true),
            "{r:?}"
        );
        assert_eq!(
            r.header("ratelimit")
                .map(|v| v.contains(&format!("r={}", 2 - i))),
            Some(true),
            "{r:?}"
        );
    }
    let refused = get(&g, "/items", &[]);
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(
        refused.header("x-ratelimit-remaining"),
        Some("0"),
        "{refused:?}"
    );
    assert!(refused.header("x-ratelimit-reset").is_some(), "{refused:?}");
    let retry: u64 = refused
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("retry-after");
    assert!((1..=3600).contains(&retry), "{retry}");
    assert!(
        refused
            .header("ratelimit-policy")
            .is_some_and(|v| v.contains("q=3;w=3600")),
        "{refused:?}"
    );
}

/// A GET of `/items` through `g` with one header given as raw bytes (which
/// need not be UTF-8); the response's status.
fn get_with_raw_header(g: &Gateway, header: &[u8]) -> u16 {
    let mut stream = TcpStream::connect_timeout(&g.addr, Duration::from_secs(2)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut request = format!(
        "GET /items HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        g.addr
    )
    .into_bytes();
    request.extend_from_slice(header);
    request.extend_from_slice(b"\r\n\r\n");
    stream.write_all(&request).expect("send");
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let head = String::from_utf8_lossy(&raw);
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {head:?}"))
}

#[test]
fn a_header_value_that_is_not_utf8_is_limited_like_any_other() {
    let tollgate = Tollgate::start(GATEWAY_RULES, &[]);
    let g = gateway("gateway.yaml", tollgate.addr.port());
    // per-user: 2 an hour. Before, each of these was undecodable (a
    // protobuf string must be UTF-8), Envoy failed open, and all passed.
    let statuses: Vec<u16> = (0..5)
        .map(|_| get_with_raw_header(&g, b"x-user-id: mallory\xff"))
        .collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    // Other bytes are another client.
    assert_eq!(get_with_raw_header(&g, b"x-user-id: mallory\xfe"), 200);
    assert_eq!(get_with_raw_header(&g, b"x-user-id: mallory"), 200);
    // Envoy's own count (the stats of the route's cluster): refused by the
    // service, never an error.
    assert_eq!(g.envoy.stat("cluster.upstream.ratelimit.over_limit"), 3);
    assert_eq!(g.envoy.stat("cluster.upstream.ratelimit.error"), 0);
}

#[test]
fn envoys_access_log_names_the_rule_that_decided_each_request() {
    let tollgate = Tollgate::start(GATEWAY_RULES, &[]);
    let (listen, upstream, admin) = (free_port(), free_port(), free_port());
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("access.log");
    // The shipped configuration, its stdout access log written to a file.
    let file_logger = format!(
        "\"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog\n                      path: {}",
        log.display()
    );
    let envoy = Envoy::start_replacing(
        "gateway.yaml",
        &[
            (10000, listen),
            (10001, upstream),
            (9901, admin),
            (8081, tollgate.addr.port()),
        ],
        &[(
            "\"@type\": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
            &file_logger,
        )],
        admin,
    );
    let g = Gateway {
        envoy,
        addr: SocketAddr::from(([127, 0, 0, 1], listen)),
    };
    let ann = [("x-user-id", "ann")];
    let codes: Vec<u16> = (0..3).map(|_| get(&g, "/items", &ann).status).collect();
    assert_eq!(codes, [200, 200, 429]);
    let mut lines = Vec::new();
    let logged = crate::common::holds_within(Duration::from_secs(5), || {
        lines = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        lines.len() >= 3
    });
    assert!(logged, "three access log lines: {lines:?}");
    // Each names the rule (per-user: its path), its file:line, and what it
    // left; the refused one 0.
    for (line, remaining) in lines
        .iter()
        .zip(["remaining=1", "remaining=0", "remaining=0"])
    {
        assert!(line.contains("rule=gateway.user "), "{line}");
        assert!(
            line.contains("rules.yaml:8 "),
            "the rule's line in its file: {line}"
        );
        assert!(line.ends_with(remaining), "{line}");
    }
    assert!(lines[2].contains(" 429 "), "{}", lines[2]);
}

#[test]
fn the_user_limit_trips_first_and_spends_nothing_of_the_organisation() {
    let tollgate = Tollgate::start(GATEWAY_RULES, &[]);
    let g = gateway("gateway.yaml", tollgate.addr.port());
    let ann = [("x-user-id", "ann"), ("x-org-id", "acme")];
    let bob = [("x-user-id", "bob"), ("x-org-id", "acme")];
    assert_eq!(get(&g, "/items", &ann).status, 200);
    assert_eq!(get(&g, "/items", &ann).status, 200);
    for _ in 0..5 {
        assert_eq!(
            get(&g, "/items", &ann).status,
            429,
            "ann is over her own limit"
        );
    }
    // Ann's refused calls did not spend acme's budget: 5 - 2 = 3 left for bob... of which bob's own limit allows 2.
    assert_eq!(get(&g, "/items", &bob).status, 200);
    assert_eq!(get(&g, "/items", &bob).status, 200);
    let carol = [("x-user-id", "carol"), ("x-org-id", "acme")];
    assert_eq!(
        get(&g, "/items", &carol).status,
        200,
        "the fifth of acme's five"
    );
    let refused = get(&g, "/items", &[("x-user-id", "dan"), ("x-org-id", "acme")]);
    assert_eq!(refused.status, 429, "acme is spent");
}

#[test]
fn health_and_webhooks_are_never_limited_and_shadow_rules_never_block() {
    let tollgate = Tollgate::start(GATEWAY_RULES, &[]);
    let g = gateway("gateway.yaml", tollgate.addr.port());
    for _ in 0..10 {
        assert_eq!(get(&g, "/healthz", &[]).status, 200);
        assert_eq!(get(&g, "/webhooks/stripe", &[]).status, 200);
        assert_eq!(
            get(&g, "/search?q=x", &[]).status,
            200,
            "shadow mode only watches"
        );
    }
    // The login limit is enforced (and separate from the anonymous one).
    assert_eq!(get(&g, "/login", &[]).status, 200);
    assert_eq!(get(&g, "/login", &[]).status, 200);
    assert_eq!(get(&g, "/login", &[]).status, 429);
    // Envoy did ask Tollgate for /search (and it said OK each time).
    assert!(g.envoy.stat("cluster.upstream.ratelimit.ok") >= 10);
}

#[test]
fn two_gateways_sharing_one_redis_enforce_one_global_limit() {
    let redis = RedisServer::start();
    let url = redis.url();
    let args = [
        "--store",
        "redis",
        "--redis-url",
        url.as_str(),
        "--redis-timeout",
        "200ms",
    ];
    let (t1, t2) = (
        Tollgate::start(GATEWAY_RULES, &args),
        Tollgate::start(GATEWAY_RULES, &args),
    );
    let (g1, g2) = (
        gateway("gateway.yaml", t1.addr.port()),
        gateway("gateway.yaml", t2.addr.port()),
    );
    let mut admitted = 0;
    for i in 0..12 {
        let g = if i % 2 == 0 { &g1 } else { &g2 };
        if get(g, "/items", &[]).status == 200 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3, "one anonymous limit of 3 across both gateways");
}

#[test]
fn with_tollgate_stopped_envoy_follows_failure_mode_deny() {
    let mut tollgate = Tollgate::start(GATEWAY_RULES, &[]);
    let port = tollgate.addr.port();
    let open = gateway("gateway.yaml", port);
    let closed = gateway("egress.yaml", port);
    let _ = tollgate.child.kill();
    let _ = tollgate.child.wait();
    // gateway.yaml: failure_mode_deny false, so traffic flows.
    for _ in 0..5 {
        assert_eq!(get(&open, "/items", &[]).status, 200);
    }
    assert!(
        open.envoy
            .stat("cluster.upstream.ratelimit.failure_mode_allowed")
            >= 5
    );
    // egress.yaml: failure_mode_deny true, so paid calls are refused.
    let r = http(closed.addr, "POST", "/v1/chat", &[("x-model", "large")]).expect("answer");
    assert_eq!(r.status, 500, "{r:?}");
}

#[test]
fn the_tcp_filter_closes_connections_over_the_limit() {
    let tollgate = Tollgate::start(
        "domain: tcp\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        &[],
    );
    let g = gateway("tcp.yaml", tollgate.addr.port());
    let served = |addr: SocketAddr| -> bool {
        let Ok(mut s) = TcpStream::connect(addr) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.starts_with("HTTP/1.1 200")
    };
    let results: Vec<bool> = (0..5).map(|_| served(g.addr)).collect();
    assert_eq!(
        results,
        [true, true, true, false, false],
        "3 connections per hour"
    );
    assert!(g.envoy.stat("ratelimit.tcp.cx_closed") >= 2);
}

#[test]
fn envoy_reaches_tollgate_over_mutual_tls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = crate::common::tls::Pki::new(dir.path());
    let tollgate = Tollgate::start(
        "domain: gateway\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
        &pki.mutual_tls_args().each_ref().map(String::as_str),
    );
    let (listen, upstream, admin) = (free_port(), free_port(), free_port());
    let tls_dir = format!("{}/", dir.path().display());
    let envoy = Envoy::start_replacing(
        "mtls.yaml",
        &[
            (10300, listen),
            (10301, upstream),
            (9904, admin),
            (8081, tollgate.addr.port()),
        ],
        &[("/etc/envoy/tls/", tls_dir.as_str())],
        admin,
    );
    let g = Gateway {
        envoy,
        addr: SocketAddr::from(([127, 0, 0, 1], listen)),
    };
    // 3 per hour per client address; Envoy fails closed here, so a 200
    // proves Tollgate answered over mTLS.
    for i in 0..3 {
        let r = get(&g, "/items", &[]);
        assert_eq!(r.status, 200, "request {i}: {r:?}");
    }
    assert_eq!(get(&g, "/items", &[]).status, 429);
    assert!(g.envoy.stat("cluster.tollgate.ssl.handshake") >= 1);
}
