//! Soft limits (`over_limit: tag`) and the refusal's body
//! (`--over-limit-body json`), through the limiter on the memory store.

use std::sync::Arc;

use super::tests::req;
use super::*;
use crate::clock::{ManualClock, NANOS_PER_SEC};
use crate::rules::RuleSet;
use crate::store::MemoryStoreOptions;

const RULES: &str = r#"domain: api
descriptors:
  - key: user
    over_limit: tag
    rate_limit: {name: per-user-soft, unit: minute, requests_per_unit: 2}
  - key: org
    over_limit: tag
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: team
    rate_limit: {name: per-team, unit: minute, requests_per_unit: 1}
  - key: watch
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: odd
    rate_limit: {name: "quote\" back\\ nl\n é", unit: hour, requests_per_unit: 1}
  - key: closed
    rate_limit: {name: closed, unit: hour, requests_per_unit: 0}
"#;

fn limiter(options: LimiterOptions) -> Limiter {
    let rules = RuleSet::from_yaml(RULES).expect("rules load");
    // 10 s into a minute.
    let clock = ManualClock::new((1_000 * 60 + 10) * NANOS_PER_SEC);
    Limiter::new(
        rules,
        Store::memory(MemoryStoreOptions::default()),
        Arc::new(clock),
        options,
    )
}

fn json() -> LimiterOptions {
    LimiterOptions {
        over_limit_body: OverLimitBody::Json,
        ..LimiterOptions::default()
    }
}

async fn decide(l: &Limiter, descriptors: &[&[(&str, &str)]]) -> Decision {
    l.should_rate_limit(&req(descriptors))
        .await
        .expect("decided")
}

fn tag(d: &Decision) -> Option<&str> {
    d.request_headers
        .iter()
        .find(|(k, _)| *k == OVER_LIMIT_HEADER)
        .map(|(_, v)| v.as_str())
}

fn header<'a>(d: &'a Decision, name: &str) -> Option<&'a str> {
    d.headers
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn over_a_soft_limit_the_request_is_admitted_and_tagged() {
    let l = limiter(LimiterOptions::default());
    for i in 0..2 {
        let d = decide(&l, &[&[("user", "ann")]]).await;
        assert!(!d.over_limit, "request {i}");
        assert_eq!(tag(&d), None, "request {i} is within the limit");
    }
    for i in 0..3 {
        let d = decide(&l, &[&[("user", "ann")]]).await;
        assert!(!d.over_limit && !d.statuses[0].over_limit, "request {i}");
        assert!(d.statuses[0].tagged);
        assert_eq!(tag(&d), Some("per-user-soft"));
        // Not advertised: it refuses nothing.
        assert_eq!(header(&d, "ratelimit-policy"), None, "{d:?}");
        assert_eq!(d.body, None);
    }
    // Counted as shadow mode counts: over the limit, and admitted by it.
    let metrics = l.metrics().render();
    for series in [
        r#"ratelimit_service_rate_limit_over_limit{domain="api",key1="user"} 3"#,
        r#"ratelimit_service_rate_limit_shadow_mode{domain="api",key1="user"} 3"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="api",key1="user"} 2"#,
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }
}

#[tokio::test]
async fn hits_over_a_soft_limit_are_not_charged_as_shadow_modes_are_not() {
    let l = limiter(LimiterOptions::default());
    for _ in 0..3 {
        decide(&l, &[&[("org", "acme")], &[("watch", "w")]]).await;
    }
    // A check of zero hits reads what is left.
    let mut check = req(&[&[("org", "acme")], &[("watch", "w")]]);
    for d in &mut check.descriptors {
        d.hits_addend = Some(0);
    }
    let d = l.should_rate_limit(&check).await.expect("decided");
    let remaining: Vec<u32> = d.statuses.iter().map(|s| s.remaining).collect();
    assert_eq!(remaining, [0, 0], "each spent its one hit, no more");
}

#[tokio::test]
async fn several_soft_limits_are_one_header_value_each_name_once() {
    let l = limiter(LimiterOptions::default());
    let both: &[&[(&str, &str)]] = &[&[("org", "acme")], &[("user", "bo")], &[("org", "acme")]];
    let first = decide(&l, both).await;
    // org: 1 a minute, asked twice in this request: over on the second.
    assert_eq!(tag(&first), Some("api.org"));
    decide(&l, &[&[("user", "bo")]]).await;
    let d = decide(&l, both).await;
    assert!(!d.over_limit);
    assert_eq!(tag(&d), Some("api.org, per-user-soft"));
    assert_eq!(d.request_headers.len(), 1);
}

#[tokio::test]
async fn a_hard_limit_refuses_and_nothing_is_tagged_or_charged() {
    let l = limiter(json());
    decide(&l, &[&[("user", "cy")], &[("user", "cy")]]).await;
    decide(&l, &[&[("team", "red")]]).await;
    // user is over its soft limit, team over its hard one.
    let d = decide(&l, &[&[("user", "cy")], &[("team", "red")]]).await;
    assert!(d.over_limit && !d.statuses[0].over_limit && d.statuses[1].over_limit);
    assert_eq!(tag(&d), None, "a refused request goes nowhere");
    let body: serde_json::Value =
        serde_json::from_str(d.body.as_deref().expect("a body")).expect("JSON");
    assert_eq!(
        body["rule"], "per-team",
        "the hard limit refused, not the soft one"
    );
}

#[tokio::test]
async fn global_shadow_mode_tags_nothing() {
    let l = limiter(LimiterOptions {
        shadow_mode: true,
        ..LimiterOptions::default()
    });
    for _ in 0..4 {
        let d = decide(&l, &[&[("user", "di")]]).await;
        assert!(!d.over_limit);
        assert_eq!(tag(&d), None);
    }
}

#[tokio::test]
async fn the_json_body_says_retry_afters_number_and_the_rule() {
    let l = limiter(json());
    let admitted = decide(&l, &[&[("team", "blue")]]).await;
    assert_eq!(admitted.body, None, "an admitted request has no body");
    assert_eq!(header(&admitted, "content-type"), None);
    let d = decide(&l, &[&[("team", "blue")]]).await;
    assert!(d.over_limit);
    let retry: u64 = header(&d, "retry-after")
        .and_then(|r| r.parse().ok())
        .expect("retry-after");
    assert!(
        (49..=51).contains(&retry),
        "about the minute's 50 s left: {retry}"
    );
    let expected =
        format!(r#"{{"error":"rate_limited","retry_after_seconds":{retry},"rule":"per-team"}}"#);
    assert_eq!(d.body.as_deref(), Some(expected.as_str()));
    assert_eq!(header(&d, "content-type"), Some("application/json"));

    // Without response headers the number is the same.
    let quiet = limiter(LimiterOptions {
        response_headers: false,
        ..json()
    });
    decide(&quiet, &[&[("team", "blue")]]).await;
    let d = decide(&quiet, &[&[("team", "blue")]]).await;
    assert_eq!(header(&d, "retry-after"), None);
    let number = format!(r#""retry_after_seconds":{retry},"#);
    assert!(
        d.body.as_deref().is_some_and(|b| b.contains(&number)),
        "{d:?}"
    );
    assert_eq!(d.headers, [("content-type", "application/json".to_owned())]);
}

#[tokio::test]
async fn a_hostile_name_is_escaped_and_a_zero_limit_has_no_wait() {
    let l = limiter(json());
    decide(&l, &[&[("odd", "x")]]).await;
    let d = decide(&l, &[&[("odd", "x")]]).await;
    let body: serde_json::Value =
        serde_json::from_str(d.body.as_deref().expect("a body")).expect("valid JSON");
    assert_eq!(body["rule"], "quote\" back\\ nl\n é");
    assert_eq!(body["error"], "rate_limited");
    let d = decide(&l, &[&[("closed", "x")]]).await;
    assert_eq!(header(&d, "retry-after"), None);
    assert_eq!(
        d.body.as_deref(),
        Some(r#"{"error":"rate_limited","retry_after_seconds":null,"rule":"closed"}"#)
    );
}

#[tokio::test]
async fn none_keeps_the_answer_as_it_was() {
    let plain = limiter(LimiterOptions::default());
    let with_json = limiter(json());
    for _ in 0..2 {
        let a = decide(&plain, &[&[("team", "x")]]).await;
        let b = decide(&with_json, &[&[("team", "x")]]).await;
        assert_eq!(a.body, None);
        if a.over_limit {
            assert!(b.body.is_some());
            assert_eq!(b.headers[..a.headers.len()], a.headers[..]);
        } else {
            assert_eq!(a, b, "admitted: the same answer either way");
        }
    }
    assert_eq!(plain.undecided_refusal().body, None);
    assert!(plain.undecided_refusal().headers.is_empty());
    assert_eq!(
        with_json.undecided_refusal().body.as_deref(),
        Some(r#"{"error":"rate_limited","retry_after_seconds":null,"rule":null}"#)
    );
}
