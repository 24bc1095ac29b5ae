//! Tollgate started exactly as Envoy Gateway's rate limit Deployment starts
//! envoyproxy/ratelimit (`/bin/ratelimit`, no arguments, the environment of
//! `internal/infrastructure/kubernetes/ratelimit/testdata/deployments/default.yaml`,
//! with hosts, ports and paths mapped to the test's): rules over xDS with
//! mutual TLS, gRPC over TLS, Redis, readiness, and the reference's stats
//! through a statsd-exporter mapping on PROMETHEUS_ADDR, as Envoy Gateway's
//! dashboards read them. And the older generation (up to 1.1): statsd.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::io::Read;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::envoy::http;
use crate::common::gateway::{Deployment, Gateway, borrowed};
use crate::common::redis::{RedisServer, free_port};
use crate::common::tls::{client_config, tls_call};
use crate::common::{Tollgate, ask, request};
use tollgate::test_util::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};

/// A statsd-exporter mapping with the shapes Envoy Gateway's
/// `statsd_conf.yaml` uses: globs for one key, a regex for two or more,
/// `$n` labels, `match_metric_type`, timers as histograms.
const MAPPING: &str = r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.over_limit"
    name: "ratelimit_service_rate_limit_over_limit"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.total_hits"
    match_type: regex
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: "ratelimit.service.call.should_rate_limit.*"
    name: "ratelimit_service_should_rate_limit_error"
    match_metric_type: counter
    labels: {err_type: "$1"}
  - match: "ratelimit_server.*.total_requests"
    name: "ratelimit_service_total_requests"
    match_metric_type: counter
    labels: {grpc_method: "$1"}
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: histogram
    labels: {grpc_method: "$1"}
  - match: "ratelimit.service.config_load_success"
    name: "ratelimit_service_config_load_success"
    match_metric_type: counter
  - match: "ratelimit.service.config_load_error"
    name: "ratelimit_service_config_load_error"
    match_metric_type: counter
"#;

fn rules(limit: u32) -> Vec<RateLimitConfig> {
    vec![RateLimitConfig {
        name: "default/eg/httproute/api".into(),
        domain: "t".into(),
        descriptors: vec![
            RateLimitDescriptor {
                key: "user".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Hour as i32,
                    requests_per_unit: limit,
                    ..Default::default()
                }),
                ..Default::default()
            },
            RateLimitDescriptor {
                key: "path".into(),
                value: "/login".into(),
                descriptors: vec![RateLimitDescriptor {
                    key: "remote_address".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unit: RateLimitUnit::Minute as i32,
                        requests_per_unit: 5,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            },
        ],
    }]
}

fn line<'a>(text: &'a str, start: &str) -> Option<&'a str> {
    text.lines().find(|l| l.starts_with(start))
}

#[tokio::test(flavor = "multi_thread")]
async fn envoy_gateways_default_deployment_runs_on_the_image_swap() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Envoy Gateway's `envoy-rate-limit` secret: one certificate serves gRPC
    // and is the client certificate to the xDS server.
    let gateway = Gateway::start(dir.path()).await;
    let (pki, xds) = (&gateway.pki, &gateway.xds);
    let redis = RedisServer::start();
    let mapping = dir.path().join("conf.yaml");
    std::fs::write(&mapping, MAPPING).expect("mapping");
    let deployment = Deployment::new(
        &gateway,
        format!("127.0.0.1:{}", redis.port),
        [
            pki.path("ratelimit"),
            pki.key_path("ratelimit"),
            pki.path("ca"),
        ],
        dir.path().join("data").display().to_string(),
    );
    let http_port = deployment.http_port;
    let prometheus = free_port();
    let mut env = deployment.env();
    env.extend([
        ("USE_PROMETHEUS", "true".to_owned()),
        ("PROMETHEUS_ADDR", format!(":{prometheus}")),
        ("PROMETHEUS_MAPPER_YAML", mapping.display().to_string()),
    ]);
    let env = borrowed(&env);
    let server = Tollgate::start_as_reference(&env);
    let probe = SocketAddr::from(([127, 0, 0, 1], http_port));
    // FORCE_START_WITHOUT_INITIAL_CONFIG=true: ready before any rules.
    let health = http(probe, "GET", "/healthcheck", &[]).expect("plain HTTP probe");
    assert_eq!(health.status, 200, "{health:?}");

    // The node id Envoy Gateway keys its snapshot by; then the rules.
    let hello = xds
        .wait_for("the first request", |s| s.node_id.is_some())
        .await;
    assert_eq!(hello.node_id.as_deref(), Some("envoy-ratelimit"));
    xds.set("1", rules(2));
    xds.wait_for("the ACK", |s| s.version_info == "1").await;

    // Envoy reaches it over TLS (Envoy Gateway's proxies present no client
    // certificate: GRPC_SERVER_TLS_CA_CERT is not read by the reference).
    let mut remaining = Vec::new();
    for _ in 0..3 {
        let answer = tls_call(server.addr, client_config(pki, "ca", None))
            .await
            .expect("gRPC over TLS");
        remaining.push((answer.overall_code, answer.statuses[0].limit_remaining));
    }
    assert_eq!(
        remaining,
        [(1, 1), (1, 0), (2, 0)],
        "OK, OK, OVER_LIMIT on Redis"
    );
    let keys = redis.cli(&["--scan"]);
    assert!(!keys.trim().is_empty(), "counters live in Redis");

    // The mapped metrics Envoy Gateway's dashboards query.
    let scrape = SocketAddr::from(([127, 0, 0, 1], prometheus));
    let metrics = http(scrape, "GET", "/metrics", &[]).expect("metrics").body;
    assert_eq!(
        line(
            &metrics,
            "ratelimit_service_rate_limit_total_hits{domain=\"t\",key1=\"user\"}"
        ),
        Some("ratelimit_service_rate_limit_total_hits{domain=\"t\",key1=\"user\"} 3"),
        "{metrics}"
    );
    assert_eq!(
        line(
            &metrics,
            "ratelimit_service_rate_limit_over_limit{domain=\"t\",key1=\"user\"}"
        ),
        Some("ratelimit_service_rate_limit_over_limit{domain=\"t\",key1=\"user\"} 1"),
        "{metrics}"
    );
    assert_eq!(
        line(
            &metrics,
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"}"
        ),
        Some("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("# TYPE ratelimit_service_response_time_seconds histogram"),
        "{metrics}"
    );
    assert!(
        line(
            &metrics,
            "ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\"} 3"
        )
        .is_some(),
        "{metrics}"
    );
    assert_eq!(
        line(&metrics, "ratelimit_service_config_load_success "),
        Some("ratelimit_service_config_load_success 1")
    );
    drop(server);
}

/// Counter totals (statsd sends increases: they are summed) and the timer
/// names seen in statsd `text`.
fn statsd_totals(text: &str) -> (std::collections::HashMap<String, u64>, Vec<String>) {
    let mut counters = std::collections::HashMap::new();
    let mut timers = Vec::new();
    for line in text.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let mut parts = rest.split('|');
        let (value, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        match kind {
            "c" => {
                *counters.entry(name.to_owned()).or_insert(0) += value.parse::<u64>().unwrap_or(0)
            }
            "ms" => timers.push(name.to_owned()),
            _ => {}
        }
    }
    (counters, timers)
}

/// Reads statsd lines from a TCP listener until every counter of `want`
/// reached its total and `timer` was seen (10 s); the text read.
fn statsd_tcp_lines(listener: std::net::TcpListener, want: &[(&str, u64)], timer: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut conn, _) = listener.accept().expect("statsd connection");
    conn.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let mut text = String::new();
    loop {
        let (counters, timers) = statsd_totals(&text);
        if want
            .iter()
            .all(|(name, total)| counters.get(*name) == Some(total))
            && timers.iter().any(|t| t == timer)
        {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "statsd totals {want:?} and {timer}; got:\n{text}"
        );
        let mut buf = [0u8; 8192];
        if let Ok(n) = conn.read(&mut buf) {
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_older_generation_reads_statsd_over_tcp_and_dogstatsd_over_udp() {
    let rules = "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    // Envoy Gateway up to 1.1: USE_STATSD=true, STATSD_PORT=9125 (a
    // statsd-exporter sidecar), over TCP as the reference sends.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port().to_string();
    let server = Tollgate::start_with_env(
        rules,
        &["--statsd-flush-interval", "100ms"],
        &[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", &port),
        ],
    );
    let mut client = server.client().await;
    ask(&mut client, request("t", &[&[("user", "ann")]])).await;
    ask(&mut client, request("t", &[&[("user", "ann")]])).await;
    let text = statsd_tcp_lines(
        listener,
        &[
            ("ratelimit.service.rate_limit.t.user.total_hits", 2),
            ("ratelimit.service.rate_limit.t.user.over_limit", 1),
            ("ratelimit_server.ShouldRateLimit.total_requests", 2),
        ],
        "ratelimit_server.ShouldRateLimit.response_time",
    );
    assert!(
        text.lines().all(|l| l.contains(':') && l.contains('|')),
        "{text}"
    );

    // DogStatsD over UDP with tags.
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let addr = socket.local_addr().expect("addr").to_string();
    let server = Tollgate::start(
        rules,
        &[
            "--statsd",
            &addr,
            "--statsd-protocol",
            "udp",
            "--dogstatsd",
            "on",
            "--statsd-tags",
            "env:ci,team:gw",
            "--statsd-flush-interval",
            "100ms",
        ],
    );
    let mut client = server.client().await;
    ask(&mut client, request("t", &[&[("user", "bob")]])).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let want = "ratelimit.service.rate_limit.t.user.total_hits:1|c|#env:ci,team:gw";
    let mut text = String::new();
    while !text.contains(want) {
        assert!(Instant::now() < deadline, "{want}; got:\n{text}");
        let mut buf = [0u8; 2048];
        if let Ok(n) = socket.recv(&mut buf) {
            assert!(n <= tollgate::test_util::MAX_DATAGRAM, "{n}");
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
            text.push('\n');
        }
    }
}
