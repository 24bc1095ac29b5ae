use std::path::PathBuf;

use super::*;

fn load(text: &str) -> Result<RuleSet, RuleErrors> {
    load_sources(
        &[(PathBuf::from("rules.yaml"), text.to_owned())],
        &LoadOptions::default(),
    )
}

fn limit_of(rules: &RuleSet, entries: &[(&str, &str)]) -> Option<u32> {
    rules
        .lookup("d", entries)
        .and_then(|m| m.rules[0].limit)
        .map(|l| l.requests_per_unit)
}

#[test]
fn exact_then_wildcards_in_order_then_key_default() {
    let rules = load(
        "domain: d
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*/login
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /api/v1/login
    rate_limit: {unit: second, requests_per_unit: 4}
",
    )
    .expect("loads");
    assert_eq!(limit_of(&rules, &[("path", "/api/v1/login")]), Some(4));
    assert_eq!(limit_of(&rules, &[("path", "/api/v2/login")]), Some(2));
    assert_eq!(limit_of(&rules, &[("path", "/api/v2/users")]), Some(3));
    assert_eq!(limit_of(&rules, &[("path", "/other")]), Some(1));
    assert_eq!(limit_of(&rules, &[("other", "/other")]), None);
}

#[test]
fn share_threshold_keys_by_the_pattern() {
    let rules = load(
        "domain: d
descriptors:
  - key: user
    value: bot-*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 1}
",
    )
    .expect("loads");
    let m = rules.lookup("d", &[("user", "bot-7")]).expect("matches");
    assert_eq!(m.shared.as_slice(), &[(0, "bot-*")]);
    let refused = load(
        "domain: d
descriptors:
  - key: user
    value: exact
    share_threshold: true
",
    )
    .expect_err("share_threshold needs a wildcard");
    assert!(refused.to_string().contains("share_threshold"), "{refused}");
}

#[test]
fn tollgate_fields_are_validated() {
    let rules = load(
        "domain: d
descriptors:
  - key: k
    rate_limit: {unit: Minute, requests_per_unit: 10, algorithm: token_bucket, burst: 20, failure_mode: deny}
",
    )
    .expect("loads");
    let limit = rules
        .lookup("d", &[("k", "v")])
        .and_then(|m| m.rules[0].limit)
        .expect("limit");
    assert_eq!(limit.algorithm, crate::algorithm::Algorithm::TokenBucket);
    assert_eq!((limit.burst, limit.unit), (20, Unit::Minute));
    assert_eq!(limit.failure_mode, Some(FailureMode::Deny));

    for (yaml, needle) in [
        ("{unit: minute}", "requests_per_unit"),
        ("{requests_per_unit: 5}", "no unit"),
        ("{unit: minuet, requests_per_unit: 5}", "minuet"),
        ("{unit: minute, requests_per_unit: 5, burst: 3}", "burst"),
        (
            "{unit: minute, requests_per_unit: 5, algorithm: leaky}",
            "leaky",
        ),
        (
            "{unit: minute, requests_per_unit: 5, failure_mode: maybe}",
            "maybe",
        ),
        ("{unit: minute, requests_per_unit: -5}", "-5"),
        ("{unit: minute, requests_per_unit: 5, color: red}", "color"),
        (
            "{unit: year, requests_per_unit: 1, algorithm: token_bucket, burst: 1000}",
            "more than 100 years to refill",
        ),
    ] {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {yaml}\n");
        let err = load(&text).expect_err(yaml).to_string();
        assert!(err.contains(needle), "{yaml}: {err}");
        assert!(
            err.starts_with("rules.yaml:4:"),
            "{yaml}: names file and line: {err}"
        );
    }
    let misplaced = load("domain: d\ndescriptors:\n  - key: k\n    algorithm: fixed_window\n")
        .expect_err("algorithm belongs inside rate_limit");
    assert!(misplaced.to_string().contains("algorithm"), "{misplaced}");
}

#[test]
fn default_algorithm_comes_from_the_options() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let options = LoadOptions {
        default_algorithm: crate::algorithm::Algorithm::FixedWindow,
        ..LoadOptions::default()
    };
    let rules = load_sources(&[(PathBuf::from("a.yaml"), text.into())], &options).expect("loads");
    let limit = rules
        .lookup("d", &[("k", "v")])
        .and_then(|m| m.rules[0].limit)
        .expect("limit");
    assert_eq!(limit.algorithm, crate::algorithm::Algorithm::FixedWindow);
}

#[test]
fn directories_skip_hidden_entries_like_configmap_internals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rule = |domain: &str| format!("domain: {domain}\ndescriptors: []\n");
    std::fs::create_dir(dir.path().join("..2026_11_29")).expect("mkdir");
    std::fs::write(dir.path().join("..2026_11_29/a.yaml"), rule("a")).expect("write");
    std::fs::write(dir.path().join("a.yaml"), rule("a")).expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not yaml").expect("write");
    std::fs::create_dir(dir.path().join("more")).expect("mkdir");
    std::fs::write(dir.path().join("more/b.yml"), rule("b")).expect("write");
    let rules = load_paths(&[dir.path().to_path_buf()], &LoadOptions::default()).expect("loads");
    assert_eq!(rules.domain_count(), 2);
}

#[test]
fn errors_are_all_reported_at_once() {
    let err = load(
        "domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - value: x
",
    )
    .expect_err("two problems");
    assert_eq!(err.0.len(), 2, "{err}");
    assert_eq!(err.0[0].at.map(|a| a.0), Some(4));
    assert_eq!(err.0[1].at.map(|a| a.0), Some(5));
}

#[test]
fn metric_labels_keep_each_level_whole() {
    let rules = load(
        "domain: d
descriptors:
  - key: ip
    value: 10.0.0.1
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 1}
",
    )
    .expect("loads");
    let rule = &rules.rules()[0];
    assert_eq!(
        rule.metric_labels,
        r#"domain="d",key1="ip_10.0.0.1",key2="path""#
    );
}
