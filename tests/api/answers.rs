//! What an answer carries besides its codes, through the real binary: the
//! refusal's JSON body (`--over-limit-body json`, `raw_body`) and the
//! request header of soft limits (`over_limit: tag`,
//! `request_headers_to_add`); `tollgate check` on `over_limit`.

use std::process::Command;

use crate::common::{Tollgate, ask, request, run_briefly};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const RULES: &str = r#"domain: gw
descriptors:
  - key: user
    rate_limit: {name: "per-user \"gold\"", unit: hour, requests_per_unit: 1}
  - key: team
    over_limit: tag
    rate_limit: {name: per-team, unit: hour, requests_per_unit: 1}
  - key: org
    over_limit: tag
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

fn value<'a>(headers: &'a [HeaderValue], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

fn body(r: &RateLimitResponse) -> serde_json::Value {
    serde_json::from_slice(&r.raw_body).expect("raw_body is JSON")
}

#[tokio::test]
async fn with_json_every_refusal_carries_its_wait_and_rule_as_a_json_body() {
    let tollgate = Tollgate::start(RULES, &["--over-limit-body", "json"]);
    let mut client = tollgate.client().await;
    let admitted = ask(&mut client, request("gw", &[&[("user", "ann")]])).await;
    assert_eq!(admitted.overall_code, Code::Ok as i32);
    assert!(admitted.raw_body.is_empty(), "an admitted request has none");
    assert_eq!(
        value(&admitted.response_headers_to_add, "content-type"),
        None
    );
    let refused = ask(&mut client, request("gw", &[&[("user", "ann")]])).await;
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    let retry: u64 = value(&refused.response_headers_to_add, "retry-after")
        .and_then(|v| v.parse().ok())
        .expect("retry-after");
    assert_eq!(
        body(&refused),
        serde_json::json!({
            "error": "rate_limited",
            "retry_after_seconds": retry,
            "rule": "per-user \"gold\"",
        })
    );
    // Written in this order, as the documentation shows it.
    let text = String::from_utf8(refused.raw_body.clone()).expect("UTF-8");
    assert!(
        text.starts_with(r#"{"error":"rate_limited","retry_after_seconds":"#),
        "{text}"
    );
    assert_eq!(
        value(&refused.response_headers_to_add, "content-type"),
        Some("application/json")
    );
}

#[tokio::test]
async fn the_environment_variable_asks_for_it_too_and_none_is_the_default() {
    let with_env = Tollgate::start_with_env(RULES, &[], &[("TOLLGATE_OVER_LIMIT_BODY", "json")]);
    let plain = Tollgate::start(RULES, &[]);
    for (tollgate, json) in [(&with_env, true), (&plain, false)] {
        let mut client = tollgate.client().await;
        ask(&mut client, request("gw", &[&[("user", "bo")]])).await;
        let refused = ask(&mut client, request("gw", &[&[("user", "bo")]])).await;
        assert_eq!(refused.overall_code, Code::OverLimit as i32);
        assert_eq!(!refused.raw_body.is_empty(), json);
        assert_eq!(
            value(&refused.response_headers_to_add, "content-type").is_some(),
            json
        );
        if !json {
            // Today's answer: the rate limit headers and nothing else.
            let keys: Vec<&str> = refused
                .response_headers_to_add
                .iter()
                .map(|h| h.key.as_str())
                .collect();
            assert_eq!(keys, ["ratelimit-policy", "ratelimit", "retry-after"]);
        }
    }
}

#[tokio::test]
async fn over_soft_limits_the_answer_is_ok_with_one_header_naming_them() {
    let tollgate = Tollgate::start(RULES, &["--over-limit-body", "json"]);
    let mut client = tollgate.client().await;
    let both = || request("gw", &[&[("team", "red")], &[("org", "acme")]]);
    let first = ask(&mut client, both()).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert!(first.request_headers_to_add.is_empty(), "{first:?}");
    let over = ask(&mut client, both()).await;
    assert_eq!(over.overall_code, Code::Ok as i32);
    assert!(over.statuses.iter().all(|s| s.code == Code::Ok as i32));
    assert_eq!(over.request_headers_to_add.len(), 1, "{over:?}");
    assert_eq!(
        value(&over.request_headers_to_add, "x-tollgate-over-limit"),
        Some("per-team, gw.org")
    );
    assert!(over.raw_body.is_empty(), "admitted: no body");
    // Counted over the limit, as shadow mode is.
    let over_limit =
        tollgate.metric(r#"ratelimit_service_rate_limit_over_limit{domain="gw",key1="team"}"#);
    assert_eq!(over_limit, 1);
    // With a hard limit over too: refused, nothing for the upstream.
    ask(&mut client, request("gw", &[&[("user", "cy")]])).await;
    let refused = ask(
        &mut client,
        request("gw", &[&[("team", "red")], &[("user", "cy")]]),
    )
    .await;
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    assert!(refused.request_headers_to_add.is_empty());
    assert_eq!(body(&refused)["rule"], "per-user \"gold\"");
}

#[test]
fn an_unknown_body_is_refused_by_name_at_start_up() {
    run_briefly(&["--over-limit-body", "xml"], &[]).assert_refused(&["--over-limit-body", "xml"]);
    run_briefly(&[], &[("TOLLGATE_OVER_LIMIT_BODY", "html")])
        .assert_refused(&["--over-limit-body", "html"]);
}

#[test]
fn check_knows_over_limit() {
    let dir = tempfile::tempdir().expect("dir");
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, RULES).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg(&good)
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("gw.team: 1 per hour") && stdout.contains("over_limit tag"),
        "{stdout}"
    );
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "domain: gw\ndescriptors:\n  - key: team\n    over_limit: soft\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: org\n    over_limit: tag\n",
    )
    .expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg(&bad)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.yaml:4:") && stderr.contains(r#""soft""#),
        "{stderr}"
    );
    assert!(
        stderr.contains("bad.yaml:7:") && stderr.contains("no rate_limit"),
        "{stderr}"
    );
}
