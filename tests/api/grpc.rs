//! `tollgate serve` over real gRPC: statuses, headers, all-or-nothing,
//! shadow mode, hits_addend, the limit override, malformed requests,
//! concurrency, health and shutdown.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use crate::common::{Served, Tollgate, ask, descriptor, request};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use tollgate::test_util::InProcess;

const RULES: &str = "domain: gw
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3, name: per-user}
  - key: org
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  - key: watch
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 60, algorithm: token_bucket, burst: 4}
";

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

#[tokio::test]
async fn statuses_follow_the_request_and_carry_limits() {
    let server = Served::start(RULES, &[]);
    let mut client = server.client().await;
    let r = ask(
        &mut client,
        request("gw", &[&[("user", "a")], &[("nope", "x")], &[("org", "o")]]),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 3, "one status per descriptor");
    let user = &r.statuses[0];
    assert_eq!(user.code, Code::Ok as i32);
    let limit = user.current_limit.as_ref().expect("user limit");
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit),
        ("per-user", 3, Unit::Hour as i32)
    );
    assert_eq!(user.limit_remaining, 2);
    let reset = user.duration_until_reset.as_ref().expect("reset");
    assert!(reset.seconds <= 3600 && (reset.seconds > 0 || reset.nanos > 0));
    assert_eq!(r.statuses[1].code, Code::Ok as i32, "never UNKNOWN");
    assert!(r.statuses[1].current_limit.is_none());
    assert_eq!(r.statuses[2].limit_remaining, 4);
    let policy = header(&r, "ratelimit-policy").expect("policy header");
    assert_eq!(policy, "\"per-user\";q=3;w=3600, \"gw.org\";q=5;w=3600");
    let current = header(&r, "ratelimit").expect("ratelimit header");
    assert!(current.starts_with("\"per-user\";r=2;t="), "{current}");
    assert!(header(&r, "retry-after").is_none());
}

#[tokio::test]
async fn over_limit_blocks_and_spends_nothing_from_other_descriptors() {
    let server = Served::start(RULES, &[]);
    let mut client = server.client().await;
    let both = request("gw", &[&[("org", "acme")], &[("user", "ann")]]);
    for _ in 0..3 {
        let r = ask(&mut client, both.clone()).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    let r = ask(&mut client, both.clone()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].code, Code::Ok as i32);
    assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[1].limit_remaining, 0);
    let retry: u64 = header(&r, "retry-after")
        .expect("retry-after")
        .parse()
        .expect("seconds");
    assert!((1..=3600).contains(&retry), "{retry}");
    // The refused call did not spend the org's budget: 5 - 3 = 2 left.
    let org = ask(&mut client, request("gw", &[&[("org", "acme")]])).await;
    assert_eq!(
        org.statuses[0].limit_remaining, 1,
        "2 left before this call, 1 after"
    );
}

#[tokio::test]
async fn shadow_mode_never_blocks() {
    let server = Served::start(RULES, &[]);
    let mut client = server.client().await;
    for _ in 0..5 {
        let r = ask(&mut client, request("gw", &[&[("watch", "w")]])).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[0].code, Code::Ok as i32);
    }
}

#[tokio::test]
async fn hits_addend_at_request_and_descriptor_level() {
    let server = Served::start(RULES, &[]);
    let mut client = server.client().await;
    let mut r = request("gw", &[&[("bucket", "b")]]);
    r.hits_addend = 3;
    let out = ask(&mut client, r.clone()).await;
    assert_eq!(out.statuses[0].limit_remaining, 1, "burst 4 minus 3");
    // Per-descriptor 0 wins: a check that counts nothing.
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    let out = ask(&mut client, r.clone()).await;
    assert_eq!(
        (out.overall_code, out.statuses[0].limit_remaining),
        (Code::Ok as i32, 1)
    );
    r.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    let out = ask(&mut client, r.clone()).await;
    assert_eq!(
        out.overall_code,
        Code::OverLimit as i32,
        "2 tokens wanted, 1 left"
    );
    let wait = out.statuses[0].duration_until_reset.expect("wait");
    let wait_ms = wait.seconds * 1000 + i64::from(wait.nanos / 1_000_000);
    assert!(
        (59_000..=60_000).contains(&wait_ms),
        "one token a minute: {wait:?}"
    );
}

#[tokio::test]
async fn the_limit_override_replaces_the_rule() {
    let server = Served::start(RULES, &[]);
    let mut client = server.client().await;
    let mut d = descriptor(&[("user", "over")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Day as i32,
    });
    let r = envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
        domain: "gw".into(),
        descriptors: vec![d],
        hits_addend: 0,
    };
    let first = ask(&mut client, r.clone()).await;
    let limit = first.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!((limit.requests_per_unit, limit.unit), (1, Unit::Day as i32));
    let second = ask(&mut client, r).await;
    assert_eq!(second.overall_code, Code::OverLimit as i32);
}

#[tokio::test]
async fn malformed_requests_get_invalid_argument_with_a_reason() {
    let server = Served::start(RULES, &[]);
    let mut client = server.client().await;
    let mut bad_unit = request("gw", &[&[("user", "x")]]);
    bad_unit.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let cases = [
        (request("", &[&[("user", "x")]]), "domain must not be empty"),
        (request("gw", &[]), "no descriptors"),
        (
            request("gw", &[&[("user", "x"), ("", "y")]]),
            "descriptor 0 entry 1 has an empty key",
        ),
        (bad_unit, "no valid unit"),
    ];
    for (req, reason) in cases {
        let status = client.should_rate_limit(req).await.expect_err(reason);
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{reason}");
        assert!(status.message().contains(reason), "{}", status.message());
    }
    // An unknown domain is OK with no limit, as in the reference.
    let r = ask(&mut client, request("nobody", &[&[("user", "x")]])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());
}

#[tokio::test]
async fn fifty_concurrent_calls_against_a_limit_of_ten_admit_exactly_ten() {
    let server = Tollgate::start(RULES, &[]);
    for round in 0..3 {
        let mut calls = Vec::new();
        for i in 0..50 {
            // Several connections, so calls really run on several workers.
            let client = if i % 5 == 0 {
                Some(server.client().await)
            } else {
                None
            };
            calls.push((i, client));
        }
        let shared = server.client().await;
        let key = format!("k{round}");
        let handles: Vec<_> = calls
            .into_iter()
            .map(|(_, own)| {
                let mut client = own.unwrap_or_else(|| shared.clone());
                let req = request("gw", &[&[("hot", key.as_str())]]);
                tokio::spawn(async move { ask(&mut client, req).await })
            })
            .collect();
        let mut admitted = 0;
        for h in handles {
            if h.await.expect("task").overall_code == Code::Ok as i32 {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 10, "round {round}");
    }
}

#[tokio::test]
async fn response_headers_can_be_switched_off_by_flag_or_either_variable() {
    // In this process, through the binary's own start-up path
    // (`settings::load`): the flag, its TOLLGATE_ variable and the
    // reference's variable each switch the headers off.
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("rules");
    let rules = rules.to_str().expect("utf-8");
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], bool);
    let cases: [Case<'_>; 4] = [
        (&[], &[], true),
        (&["--response-headers", "off"], &[], false),
        (&[], &[("TOLLGATE_RESPONSE_HEADERS", "off")], false),
        (&[], &[("LIMIT_RESPONSE_HEADERS_ENABLED", "false")], false),
    ];
    for (args, env, sent) in cases {
        let args = [&["--rules", rules, "--shutdown-delay", "1ms"][..], args].concat();
        let server = InProcess::start_with_env(&args, env).expect("starts");
        let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
            .await
            .expect("connect");
        let r = ask(&mut client, request("gw", &[&[("user", "a")]])).await;
        assert_eq!(
            !r.response_headers_to_add.is_empty(),
            sent,
            "{args:?} {env:?}"
        );
        server.stop().await.expect("stops");
    }
    // A variable that contradicts the flag, and a misspelt one, stop it.
    let e = InProcess::start_with_env(
        &["--rules", rules, "--response-headers", "on"],
        &[("LIMIT_RESPONSE_HEADERS_ENABLED", "false")],
    )
    .expect_err("a contradiction");
    assert!(e.contains("LIMIT_RESPONSE_HEADERS_ENABLED"), "{e}");
    let e = InProcess::start_with_env(&["--rules", rules], &[("TOLLGATE_RESPONSE_HEADER", "off")])
        .expect_err("a typo");
    assert!(
        e.contains("unknown setting(s) TOLLGATE_RESPONSE_HEADER"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn health_reports_serving_and_sigterm_exits_cleanly() {
    let mut server = Tollgate::start(RULES, &[]);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let mut status_of = async |service: &str| {
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .expect("health")
            .into_inner()
            .status
    };
    use tonic_health::pb::health_check_response::ServingStatus;
    assert_eq!(status_of("").await, ServingStatus::Serving as i32);
    assert_eq!(
        status_of(tollgate::LIVENESS_SERVICE).await,
        ServingStatus::Serving as i32
    );
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    // Draining: not ready, still alive (a liveness probe must not restart it).
    let draining = std::time::Instant::now();
    while status_of("").await != ServingStatus::NotServing as i32 {
        assert!(
            draining.elapsed() < std::time::Duration::from_secs(1),
            "unready on SIGTERM"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        status_of(tollgate::LIVENESS_SERVICE).await,
        ServingStatus::Serving as i32
    );
    drop(health);
    let started = std::time::Instant::now();
    let exit = server.child.wait().expect("wait");
    assert!(exit.success(), "graceful exit: {exit:?}");
    assert!(
        started.elapsed() < tollgate::DRAIN_TIMEOUT,
        "closed connections drain at once, not at the drain timeout"
    );
}

#[test]
fn a_bad_rule_file_stops_start_up_naming_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
        .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--grpc-addr", "127.0.0.1:0", "--rules"])
        .arg(&path)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bad.yaml:4:"), "{stderr}");
    assert!(stderr.contains("fortnight"), "{stderr}");
}

#[test]
fn check_prints_compiled_rules_or_errors() {
    let ok = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "check",
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules"),
        ])
        .output()
        .expect("run");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(stdout.contains("api.user: 600 per minute"), "{stdout}");
    // The extensions show: several limits, calendar budgets.
    assert!(
        stdout.contains("llm.api_key: 1000000 per month@UTC (fixed_window, budget, failure_mode deny), name tokens_per_month"),
        "{stdout}"
    );
    let zone = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "check",
            "--time-zone",
            "../../etc/localtime",
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules"),
        ])
        .output()
        .expect("run");
    assert!(!zone.status.success(), "a time zone must be an IANA name");
    assert!(
        String::from_utf8_lossy(&zone.stderr).contains("not an IANA time zone name"),
        "{}",
        String::from_utf8_lossy(&zone.stderr)
    );
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "check",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/compat/configs/unknown_unit.yaml"
            ),
        ])
        .output()
        .expect("run");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown_unit.yaml:6:13"));
}
