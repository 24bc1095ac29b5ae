//! Tollgate processes on real Redis: shared limits across instances, one
//! script call per request, outages with bounded latency and per-rule failure
//! modes, recovery after a restart that lost the scripts, the reference's
//! UNAVAILABLE mode, the local fallback and the over-limit cache.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::raw::ask_bytes;
use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{Served, Tollgate, ask, client_of, eventually, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const RULES: &str = "domain: r
descriptors:
  - key: shared
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: open
    rate_limit: {unit: hour, requests_per_unit: 1000, failure_mode: allow}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 1000, failure_mode: deny}
  - key: local
    rate_limit: {unit: hour, requests_per_unit: 10, failure_mode: local}
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: many
    rate_limits:
      - {unit: hour, requests_per_unit: 100, algorithm: token_bucket}
      - {unit: minute, unit_multiplier: 5, requests_per_unit: 1000, algorithm: sliding_window}
      - {unit: month, requests_per_unit: 100000, calendar: true, time_zone: Europe/Berlin}
";

fn redis_args<'a>(url: &'a str, timeout: &'a str) -> Vec<&'a str> {
    vec![
        "--store",
        "redis",
        "--redis-url",
        url,
        "--redis-timeout",
        timeout,
    ]
}

/// Tollgate on `cluster`, with the suite's rules.
fn on_cluster(cluster: &RedisCluster) -> Served {
    let urls = cluster.urls();
    Served::start(
        RULES,
        &[
            "--store",
            "redis-cluster",
            "--redis-url",
            &urls,
            "--redis-timeout",
            "500ms",
        ],
    )
}

/// The hash slots of `keys`, as the cluster computes them.
fn slots_of(cluster: &RedisCluster, keys: &[(String, i64)]) -> std::collections::HashSet<String> {
    keys.iter()
        .map(|(k, _)| {
            cluster.nodes[0]
                .cli(&["CLUSTER", "KEYSLOT", k])
                .trim()
                .to_owned()
        })
        .collect()
}

async fn code(server: SocketAddr, descriptors: &[&[(&str, &str)]]) -> Result<i32, tonic::Status> {
    let mut client = client_of(server).await;
    client
        .should_rate_limit(request("r", descriptors))
        .await
        .map(|r| r.into_inner().overall_code)
}

#[tokio::test]
async fn two_instances_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let url = redis.url();
    let one = Served::start(RULES, &redis_args(&url, "500ms"));
    let two = Served::start(RULES, &redis_args(&url, "500ms"));
    let (mut c1, mut c2) = (one.client().await, two.client().await);
    let mut calls = Vec::new();
    for i in 0..40 {
        let mut client = if i % 2 == 0 { c1.clone() } else { c2.clone() };
        calls.push(tokio::spawn(async move {
            ask(&mut client, request("r", &[&[("shared", "x")]])).await
        }));
    }
    let mut admitted = 0;
    for call in calls {
        if call.await.expect("task").overall_code == Code::Ok as i32 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10);
    // Both see the same count afterwards.
    for client in [&mut c1, &mut c2] {
        let r = ask(client, request("r", &[&[("shared", "x")]])).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
    }
}

#[tokio::test]
async fn one_script_call_per_request_whatever_the_descriptors() {
    let redis = RedisServer::start();
    let server = Served::start(RULES, &redis_args(&redis.url(), "500ms"));
    let three: &[&[(&str, &str)]] = &[&[("a", "1")], &[("b", "1")], &[("c", "1")]];
    code(server.addr, three)
        .await
        .expect("warm up: loads the script");
    let before = redis.calls("evalsha") + redis.calls("eval");
    for _ in 0..20 {
        assert_eq!(code(server.addr, three).await.expect("ok"), Code::Ok as i32);
    }
    let after = redis.calls("evalsha") + redis.calls("eval");
    // Sequential requests: nothing to coalesce, one call each.
    assert_eq!(after - before, 20, "one script call per request");
    assert!(
        redis.keys_with_ttl().iter().all(|(_, ttl)| *ttl > 0),
        "every key expires"
    );
}

#[tokio::test]
async fn one_script_call_per_slot_on_a_cluster() {
    let cluster = RedisCluster::start();
    let server = on_cluster(&cluster);
    let three: &[&[(&str, &str)]] = &[&[("a", "1")], &[("b", "2")], &[("c", "3")]];
    code(server.addr, three).await.expect("warm up");
    let slots = slots_of(&cluster, &cluster.keys_with_ttl());
    let before = cluster.calls("evalsha") + cluster.calls("eval");
    for _ in 0..10 {
        assert_eq!(code(server.addr, three).await.expect("ok"), Code::Ok as i32);
    }
    let after = cluster.calls("evalsha") + cluster.calls("eval");
    assert_eq!(
        after - before,
        10 * slots.len() as u64,
        "one call per slot ({} slots)",
        slots.len()
    );
    assert!(
        cluster.keys_with_ttl().iter().all(|(_, ttl)| *ttl > 0),
        "every key expires"
    );
}

#[tokio::test]
async fn several_limits_of_one_descriptor_are_one_script_call_on_a_cluster() {
    let cluster = RedisCluster::start();
    let server = on_cluster(&cluster);
    let many: &[&[(&str, &str)]] = &[&[("many", "key-1")]];
    code(server.addr, many).await.expect("warm up");
    // Three limits, four keys (the sliding window reads two), one hash tag.
    let keys = cluster.counters_with_ttl();
    assert_eq!(keys.len(), 3, "{keys:?}");
    assert!(
        keys.iter().any(|(k, _)| k.contains(":sw:5minute:"))
            && keys
                .iter()
                .any(|(k, _)| k.contains(":fw:month@Europe/Berlin:")),
        "{keys:?}"
    );
    let slots = slots_of(&cluster, &keys);
    assert_eq!(slots.len(), 1, "one slot for the descriptor's limits");
    let before = cluster.calls("evalsha") + cluster.calls("eval");
    for _ in 0..10 {
        assert_eq!(code(server.addr, many).await.expect("ok"), Code::Ok as i32);
    }
    let after = cluster.calls("evalsha") + cluster.calls("eval");
    assert_eq!(after - before, 10, "one script call per request");
    assert!(keys.iter().all(|(_, ttl)| *ttl > 0), "every key expires");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outage_gets_each_rules_failure_mode_in_bounded_time_then_recovers() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let server = Tollgate::start(
        RULES,
        &[&redis_args(&url, "30ms")[..], &["--redis-breaker", "3"]].concat(),
    );
    let mut client = server.client().await;
    let one = |d: &'static str| request("r", &[&[(d, "x")]]);
    assert_eq!(
        ask(&mut client, one("tight")).await.overall_code,
        Code::Ok as i32
    );

    redis.kill();
    let mut slowest = Duration::ZERO;
    for i in 0..30 {
        for (key, expected) in [("open", Code::Ok), ("closed", Code::OverLimit)] {
            let started = Instant::now();
            let r = client
                .should_rate_limit(one(key))
                .await
                .expect("answered, not an error")
                .into_inner();
            slowest = slowest.max(started.elapsed());
            assert_eq!(
                r.overall_code, expected as i32,
                "{key} during the outage (call {i})"
            );
        }
    }
    // 30 ms timeout plus a few milliseconds (the gRPC round trip on a debug build).
    assert!(
        slowest < Duration::from_millis(30 + 40),
        "slowest decision took {slowest:?}"
    );
    assert_eq!(
        server.log_count("Redis unavailable"),
        1,
        "the outage is logged once"
    );

    // Redis comes back empty: no scripts, no counters.
    redis.restart();
    let recovered = eventually(Duration::from_secs(10), async || {
        ask(&mut client, one("closed")).await.overall_code == Code::Ok as i32
    })
    .await;
    assert!(recovered, "Tollgate did not recover after Redis restarted");
    // Decisions go through Redis again: the limit of 1 holds.
    assert_eq!(
        ask(&mut client, request("r", &[&[("tight", "y")]]))
            .await
            .overall_code,
        Code::Ok as i32
    );
    assert_eq!(
        ask(&mut client, request("r", &[&[("tight", "y")]]))
            .await
            .overall_code,
        Code::OverLimit as i32
    );
    assert_eq!(
        server.log_count("Redis is back"),
        1,
        "the recovery is logged once"
    );
    assert!(redis.keys_with_ttl().iter().all(|(_, ttl)| *ttl > 0));
}

#[tokio::test]
async fn the_reference_mode_answers_unavailable() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let server = Served::start(
        RULES,
        &[
            &redis_args(&url, "30ms")[..],
            &["--on-store-error", "unavailable"],
        ]
        .concat(),
    );
    redis.kill();
    let status = code(server.addr, &[&[("open", "x")]])
        .await
        .expect_err("unavailable");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("Redis"), "{}", status.message());
}

#[tokio::test]
async fn the_local_failure_mode_divides_the_limit_between_instances() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let server = Served::start(
        RULES,
        &[&redis_args(&url, "30ms")[..], &["--instances", "2"]].concat(),
    );
    redis.kill();
    let mut admitted = 0;
    for _ in 0..12 {
        if code(server.addr, &[&[("local", "x")]]).await.expect("ok") == Code::Ok as i32 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5, "10 per hour across 2 instances");
}

#[tokio::test]
async fn the_over_limit_cache_keeps_refusals_off_redis() {
    let redis = RedisServer::start();
    let server = Served::start(
        RULES,
        &[
            &redis_args(&redis.url(), "500ms")[..],
            &["--over-limit-cache", "on"],
        ]
        .concat(),
    );
    assert_eq!(
        code(server.addr, &[&[("tight", "z")]]).await.expect("ok"),
        Code::Ok as i32
    );
    assert_eq!(
        code(server.addr, &[&[("tight", "z")]]).await.expect("ok"),
        Code::OverLimit as i32
    );
    let before = redis.calls("evalsha");
    for _ in 0..20 {
        assert_eq!(
            code(server.addr, &[&[("tight", "z")]]).await.expect("ok"),
            Code::OverLimit as i32
        );
    }
    assert_eq!(
        redis.calls("evalsha"),
        before,
        "refusals answered from the cache"
    );
    assert_eq!(
        code(server.addr, &[&[("tight", "other")]])
            .await
            .expect("ok"),
        Code::Ok as i32
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_calls_in_flight_finish() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut server = Tollgate::start(
        RULES,
        &[&redis_args(&url, "3s")[..], &["--shutdown-delay", "10ms"]].concat(),
    );
    let mut client = server.client().await;
    // Warm up (connection and script), then hold Redis for half a second.
    code(server.addr, &[&[("a", "warm")]]).await.expect("ok");
    let stall = redis.stall("0.5");
    let sent = Instant::now();
    let in_flight = tokio::spawn(async move {
        client
            .should_rate_limit(request("r", &[&[("a", "late")]]))
            .await
    });
    // SIGTERM once the call waits in Redis's socket.
    crate::common::wait_until("the call to reach Redis", Duration::from_secs(5), || {
        stall.waiting_bytes() > 0
    });
    let term = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let answer = in_flight
        .await
        .expect("task")
        .expect("the call in flight is answered");
    let answer = answer.into_inner();
    assert!(
        sent.elapsed() >= Duration::from_millis(250),
        "the call waited for Redis: {:?} {answer:?}",
        sent.elapsed()
    );
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert!(server.child.wait().expect("wait").success());
    assert_eq!(stall.join(), "OK", "DEBUG SLEEP ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_and_a_password_through_a_rediss_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = crate::common::tls::Pki::new(dir.path());
    let port = crate::common::redis::free_port();
    let mut redis = std::process::Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args([
            "--tls-auth-clients",
            "no",
            "--requirepass",
            "s3cret",
            "--save",
            "",
        ])
        .arg("--tls-cert-file")
        .arg(pki.pem("server"))
        .arg("--tls-key-file")
        .arg(pki.key("server"))
        .arg("--tls-ca-cert-file")
        .arg(pki.pem("ca"))
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server with TLS");
    // Redis's certificate is from a private CA, given with --redis-tls-ca;
    // the password has characters that must be escaped in a URL.
    let url = format!("rediss://:s3cret@127.0.0.1:{port}");
    crate::common::wait_until("TLS Redis started", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let ca = pki.path("ca");
    let mut args = redis_args(&url, "2s");
    args.extend(["--redis-tls-ca", ca.as_str()]);
    let server = Tollgate::start(RULES, &args);
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..2 {
        let r = client
            .should_rate_limit(request("r", &[&[("tight", "tls")]]))
            .await
            .expect("ok");
        codes.push(r.into_inner().overall_code);
    }
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::OverLimit as i32],
        "decided through Redis over TLS"
    );
    assert_eq!(
        server.log_count("Redis answers"),
        1,
        "{}",
        server.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    );
    let _ = redis.kill();
    let _ = redis.wait();
}

#[test]
fn a_build_without_insecure_tls_refuses_insecure_urls() {
    let run = crate::common::run_briefly(
        &[
            "--store",
            "redis",
            "--redis-url",
            "rediss://127.0.0.1:1/#insecure",
        ],
        &[],
    );
    run.assert_refused(&["#insecure", "--redis-tls-ca"]);
}

/// Values that differ only in bytes that are not UTF-8 (or in how such
/// bytes would be escaped) are distinct counters on `server`'s store: each
/// is admitted once under `tight` (1 an hour), then refused.
async fn distinct_bytes_are_distinct_counters(server: &Served) {
    let values: [&[u8]; 4] = [b"m\xff", b"m\xfe", "\u{FFFD}m\\xff".as_bytes(), b"m\\xff"];
    for value in values {
        let mut codes = Vec::new();
        for _ in 0..2 {
            let answer = ask_bytes(server.addr, b"r", &[&[(b"tight", value)]]).await;
            codes.push(answer.overall_code);
        }
        assert_eq!(
            codes,
            [Code::Ok as i32, Code::OverLimit as i32],
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
}

#[tokio::test]
async fn bytes_that_are_not_utf8_are_distinct_keys_on_redis_and_a_cluster() {
    let redis = RedisServer::start();
    let server = Served::start(RULES, &redis_args(&redis.url(), "500ms"));
    distinct_bytes_are_distinct_counters(&server).await;
    let keys: Vec<String> = redis
        .counters_with_ttl()
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k.contains("tight="))
        .collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    assert!(
        keys.iter().any(|k| k.contains("tight=\u{FFFD}m\\xff}")),
        "the escaped form is the key's text: {keys:?}"
    );

    let cluster = RedisCluster::start();
    let server = on_cluster(&cluster);
    distinct_bytes_are_distinct_counters(&server).await;
    let keys = cluster.counters_with_ttl();
    assert_eq!(
        keys.iter().filter(|(k, _)| k.contains("tight=")).count(),
        4,
        "{keys:?}"
    );
}
