//! Candidate rules (`serve --candidate-rules`): evaluated beside the live
//! rules, never changing the answer, counted per rule, reloaded.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]
#![allow(missing_docs)]

use std::time::Duration;

use crate::common::envoy::http;
use crate::common::{Served, Tollgate, ask, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const LIVE: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";
const CANDIDATE: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window}\n";

fn metric(body: &str, series: &str) -> u64 {
    crate::common::sample(body, series)
        .unwrap_or_else(|| panic!("{series} not in /metrics:\n{body}")) as u64
}

#[tokio::test]
async fn candidate_rules_count_what_they_would_refuse_and_never_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let candidate = dir.path().join("candidate.yaml");
    std::fs::write(&candidate, CANDIDATE).expect("write");
    let path = candidate.to_str().expect("utf-8");
    let server = Tollgate::start(
        LIVE,
        &["--candidate-rules", path, "--watch-interval", "50ms"],
    );
    let mut client = server.client().await;
    for _ in 0..5 {
        let code = ask(&mut client, request("api", &[&[("user", "ann")]])).await;
        assert_eq!(code.overall_code, Code::Ok as i32, "the live rules answer");
    }
    let body = server.metrics();
    assert_eq!(
        metric(
            &body,
            "tollgate_candidate_requests_total{rule=\"api.user\"}"
        ),
        5
    );
    assert_eq!(
        metric(&body, "tollgate_candidate_refused_total{rule=\"api.user\"}"),
        3
    );
    assert_eq!(
        metric(
            &body,
            "tollgate_candidate_decisions_total{outcome=\"stricter\"}"
        ),
        3
    );
    assert_eq!(
        metric(
            &body,
            "tollgate_candidate_decisions_total{outcome=\"same\"}"
        ),
        2
    );
    let json: serde_json::Value = serde_json::from_str(
        &http(server.admin, "GET", "/candidate", &[])
            .expect("candidate")
            .body,
    )
    .expect("json");
    assert_eq!(json["rules"][0]["rule"], "api.user");
    assert_eq!(json["rules"][0]["refused"], 3);
    assert_eq!(json["rules"][0]["last_hour"]["refused"], 3);
    let report = http(server.admin, "GET", "/candidate/report.html", &[]).expect("report");
    assert_eq!(report.status, 200);
    assert_eq!(
        report.body.matches("<svg").count(),
        1,
        "one plot per candidate rule"
    );
    // A reload of the candidate file: a looser limit stops the refusals.
    let reloads = server.log_count("rules reloaded");
    std::fs::write(
        &candidate,
        CANDIDATE.replace("requests_per_unit: 2", "requests_per_unit: 50"),
    )
    .expect("write");
    assert!(
        crate::common::eventually(Duration::from_secs(10), async || server
            .log_count("rules reloaded")
            != reloads)
        .await,
        "the candidate rules were not reloaded"
    );
    let _ = ask(&mut client, request("api", &[&[("user", "ann")]])).await;
    let body = server.metrics();
    assert_eq!(
        metric(&body, "tollgate_candidate_refused_total{rule=\"api.user\"}"),
        3
    );
    assert_eq!(
        metric(
            &body,
            "tollgate_candidate_requests_total{rule=\"api.user\"}"
        ),
        6
    );
    // A bad candidate file keeps the candidate rules in force and says why.
    std::fs::write(&candidate, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").expect("write");
    assert!(
        crate::common::eventually(Duration::from_secs(10), async || server
            .log_count("rules not reloaded")
            > 0)
        .await,
        "the bad candidate file was not reported"
    );
    assert!(server.log_count("candidate.yaml") > 0);
}

#[tokio::test]
async fn without_candidate_rules_the_endpoint_says_how_to_get_them() {
    let server = Served::start(LIVE, &[]);
    let reply = server.http("GET", "/candidate", &[], "").await;
    assert_eq!(reply.status, 404);
    assert!(reply.body.contains("--candidate-rules"), "{}", reply.body);
}

#[test]
fn bad_candidate_rules_stop_start_up() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "serve",
            "--rules",
            "examples/rules",
            "--candidate-rules",
            "/nonexistent/candidate.yaml",
        ])
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("candidate rules not loaded"), "{stderr}");
}
