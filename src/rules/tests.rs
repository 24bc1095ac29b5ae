use std::path::PathBuf;

use super::*;

fn load(text: &str) -> Result<RuleSet, RuleErrors> {
    RuleSet::from_yaml(text)
}

pub(super) fn limit_of(rules: &RuleSet, entries: &[(&str, &str)]) -> Option<u32> {
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
fn a_rules_levels_keep_each_level_whole() {
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
    assert_eq!(&*rule.domain, "d");
    assert_eq!(
        rule.levels.iter().map(AsRef::as_ref).collect::<Vec<&str>>(),
        ["ip_10.0.0.1", "path"]
    );
}

#[test]
fn rule_extensions_load_and_show_in_check() {
    let rules = load(
        "domain: d
descriptors:
  - key: api
    quota_mode: true
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 10, algorithm: token_bucket}
      - {unit: minute, unit_multiplier: 5, requests_per_unit: 1000}
      - {unit: month, requests_per_unit: 100000, calendar: true, time_zone: Europe/Berlin, budget: true}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 5, calendar: true}
",
    )
    .expect("loads");
    let m = rules.lookup("d", &[("api", "k")]).expect("matches");
    assert_eq!(m.rules.len(), 3);
    let [burst, five, month] = [&m.rules[0], &m.rules[1], &m.rules[2]];
    assert!(m.rules.iter().all(|r| r.quota_mode));
    assert_eq!(&*burst.policy_name, "burst");
    assert_eq!(
        &*five.policy_name, "d.api/5minute",
        "unnamed: path and period"
    );
    let five = five.limit.expect("limited");
    assert_eq!((five.unit_multiplier, five.period_seconds()), (5, 300));
    assert_eq!(five.quota().period, 300 * crate::clock::NANOS_PER_SEC);
    let month_limit = month.limit.expect("limited");
    assert_eq!(
        month_limit.algorithm,
        Algorithm::FixedWindow,
        "calendar limits are fixed windows"
    );
    assert_eq!(
        month_limit.calendar.map(|z| z.name()),
        Some("Europe/Berlin")
    );
    assert!(month_limit.budget);
    assert_eq!(month.limit_label.as_deref(), Some("month@Europe/Berlin"));
    // The server's zone for calendar limits without one.
    let daily = rules.lookup("d", &[("daily", "x")]).expect("matches").rules[0]
        .limit
        .expect("limited");
    assert_eq!(daily.calendar.map(|z| z.name()), Some("UTC"));
    let shown = rules.to_string();
    for needle in [
        "d.api: 10 per second (token_bucket, burst 10), name burst",
        "d.api: 1000 per 5minute (sliding_window)",
        "d.api: 100000 per month@Europe/Berlin (fixed_window, budget)",
        "quota mode",
    ] {
        assert!(shown.contains(needle), "{needle} in:\n{shown}");
    }
}

#[test]
fn rule_extensions_are_validated() {
    for (yaml, needle) in [
        (
            "rate_limit: {unit: minute, requests_per_unit: 1}\n    rate_limits: [{unit: hour, requests_per_unit: 2}]",
            "both rate_limit and rate_limits",
        ),
        ("rate_limits: []", "empty rate_limits"),
        (
            "rate_limits: [{unit: minute, requests_per_unit: 1}, {unlimited: true}]",
            "unlimited: true` in rate_limits",
        ),
        (
            "rate_limits: [{unit: minute, requests_per_unit: 1}, {unit: minute, requests_per_unit: 2}]",
            "clash",
        ),
        (
            "rate_limits: [{name: a, unit: minute, requests_per_unit: 1}, {name: a, unit: hour, requests_per_unit: 2}]",
            "both are called 'a'",
        ),
        (
            "rate_limit: {unit: minute, unit_multiplier: 0, requests_per_unit: 1}",
            "unit_multiplier must be at least 1",
        ),
        (
            "rate_limit: {unit: year, unit_multiplier: 101, requests_per_unit: 1}",
            "longer than 100 years",
        ),
        (
            "rate_limit: {unit: minute, unit_multiplier: 2.5, requests_per_unit: 1}",
            "not a whole number",
        ),
        (
            "rate_limit: {unit: hour, requests_per_unit: 1, calendar: true}",
            "calendar limits count days, weeks, months or years",
        ),
        (
            "rate_limit: {unit: month, requests_per_unit: 1, calendar: true, algorithm: sliding_window}",
            "so it is a fixed_window",
        ),
        (
            "rate_limit: {unit: month, requests_per_unit: 1, calendar: true, time_zone: Mars/Olympus}",
            "unknown time zone 'Mars/Olympus'",
        ),
        (
            "rate_limit: {unit: month, requests_per_unit: 1, time_zone: Europe/Berlin}",
            "without `calendar: true`",
        ),
        (
            "rate_limit: {unlimited: true, budget: true}",
            "budget when unlimited",
        ),
        (
            "rate_limit: {unit: day, requests_per_unit: 1, budget: maybe}",
            "invalid boolean",
        ),
        (
            "rate_limit: {unit: minute, requests_per_unit: 10, consistency: leased}",
            "sets no `lease:`",
        ),
        (
            "rate_limit: {unit: minute, requests_per_unit: 10, consistency: leased, lease: 0}",
            "lease 0 must be from 1 to the limit (10)",
        ),
        (
            "rate_limit: {unit: minute, requests_per_unit: 10, consistency: leased, lease: 11}",
            "lease 11 must be from 1 to the limit (10)",
        ),
        (
            "rate_limit: {unit: minute, requests_per_unit: 10, lease: 5}",
            "without `consistency: leased`",
        ),
        (
            "rate_limit: {unit: minute, requests_per_unit: 10, consistency: eventual}",
            "unknown consistency 'eventual'",
        ),
        (
            "rate_limit: {unit: minute, requests_per_unit: 10, budget: true, consistency: leased, lease: 5}",
            "cannot be leased",
        ),
    ] {
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    {yaml}\n");
        let err = load(&text).expect_err(yaml).to_string();
        assert!(err.contains(needle), "{yaml}: {err}");
        // The limit's line, or for the two lists the second one's.
        assert!(
            err.starts_with("rules.yaml:4:") || err.starts_with("rules.yaml:5:"),
            "{yaml}: names file and line: {err}"
        );
    }
}

#[test]
fn a_bucket_walks_the_tree_by_the_keys_it_has() {
    let rules = load(
        "domain: d
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 20}
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: client_ip
    value: 10.*
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: plan
    value: free
    descriptors:
      - key: api_key
        rate_limit: {unit: second, requests_per_unit: 5}
",
    )
    .expect("loads");
    let limit = |entries: &[(&'static str, &'static str)]| {
        let mut sorted = entries.to_vec();
        sorted.sort_unstable();
        rules.lookup_bucket("d", &sorted).map(|(m, walked)| {
            let limit = m.rules[0].limit.expect("limited").requests_per_unit;
            (limit, walked.to_vec())
        })
    };
    // A map has no order: the walk finds it whichever way it is written.
    assert_eq!(
        limit(&[("api_key", "k1")]),
        Some((20, vec![("api_key", "k1")]))
    );
    assert_eq!(
        limit(&[("path", "/login"), ("api_key", "k1")]),
        Some((2, vec![("api_key", "k1"), ("path", "/login")]))
    );
    // `api_key` sorts first and the top level has it, but that walk leaves
    // `plan` unused: the walk backs up and goes through `plan` instead.
    assert_eq!(
        limit(&[("plan", "free"), ("api_key", "k1")]),
        Some((5, vec![("plan", "free"), ("api_key", "k1")]))
    );
    assert_eq!(limit(&[("plan", "free")]), None, "a node without a limit");
    assert_eq!(limit(&[("client_ip", "10.1.2.3")]).map(|l| l.0), Some(600));
    assert_eq!(limit(&[("client_ip", "192.168.0.1")]), None);
    // Entries left over: no limit (as a descriptor with an extra entry).
    assert_eq!(limit(&[("api_key", "k1"), ("zone", "eu")]), None);
    assert_eq!(limit(&[]), None);
    assert!(rules.lookup_bucket("other", &[("api_key", "k1")]).is_none());
}

#[test]
fn booleans_are_true_or_false_only() {
    let rules = |node: &str, limit: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n{node}    rate_limit: {{unit: day, requests_per_unit: 1{limit}}}\n"
        )
    };
    for text in [
        rules("", ", calendar: \"yes\""),
        rules("", ", calendar: yes"),
        rules("    shadow_mode: on\n", ""),
    ] {
        assert!(load(&text).is_err(), "must be refused:\n{text}");
    }
    assert!(load(&rules("", ", calendar: true")).is_ok());
}

#[test]
fn a_changed_algorithm_period_or_zone_is_reported_as_restarting_counters() {
    let before = load(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 1, calendar: true, time_zone: Europe/Berlin}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: c\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    )
    .expect("rules");
    let after = load(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 1, calendar: true, time_zone: Asia/Tokyo}\n  - key: b\n    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 5}\n  - key: c\n    rate_limit: {unit: hour, requests_per_unit: 50}\n",
    )
    .expect("rules");
    let changes = restarted_counters(&before, &after);
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_eq!(
        changes[0].rule, "d.a",
        "the rule, not parsed back from the line"
    );
    assert!(
        changes[0].line.contains("d.a")
            && changes[0].line.contains("Europe/Berlin")
            && changes[0].line.contains("Asia/Tokyo"),
        "{changes:?}"
    );
    assert!(
        changes[1].line.contains("d.b") && changes[1].line.contains("5minute"),
        "{changes:?}"
    );
}

/// Issue 22: one schema error (an unknown key, a wrong type) hid every other
/// error in its file.
#[test]
fn schema_errors_in_several_descriptors_are_all_reported() {
    let err = load(
        "domain: d
descriptors:
  - key: a
    colour: red
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: c
    rate_limit: {unit: minute, requests_per_unit: lots}
  - key: e
    shadow_mode: maybe
",
    )
    .expect_err("three problems");
    let lines: Vec<u32> = err.0.iter().filter_map(|e| e.at.map(|a| a.0)).collect();
    assert_eq!(err.0.len(), 3, "{err}");
    assert_eq!(lines, [4, 9, 11], "{err}");
}

#[test]
fn each_rule_knows_its_place_in_the_set() {
    let rules = load(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: hour, requests_per_unit: 100}\n  - key: b\n    rate_limit: {unlimited: true}\n  - key: c\n    descriptors:\n      - key: e\n        rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .expect("loads");
    assert_eq!(rules.rules().len(), 4);
    for (i, rule) in rules.rules().iter().enumerate() {
        assert_eq!(rule.index, i, "{}", rule.path);
    }
    let matched = rules
        .lookup("d", &[("c", "x"), ("e", "y")])
        .expect("matches");
    assert_eq!(matched.rules[0].index, 3);
}

/// A domain, key or value beginning with the marker is matched as a request's
/// text is read (`wire_text::from_wire` escapes it): the domain too.
#[test]
fn a_rule_text_beginning_with_the_marker_matches_the_same_bytes_sent() {
    let rules = load(
        "domain: \"\\uFFFDweird\"\ndescriptors:\n  - key: \"\\uFFFDk\"\n    value: \"\\uFFFDv\"\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
    )
    .expect("rules load");
    let read = |text: &str| crate::wire_text::from_wire(text.as_bytes().to_vec());
    let (domain, key, value) = (read("\u{FFFD}weird"), read("\u{FFFD}k"), read("\u{FFFD}v"));
    assert!(rules.has_domain(&domain), "{domain:?}");
    let matched = rules
        .lookup(&domain, &[(key.as_str(), value.as_str())])
        .expect("the rule matches");
    assert_eq!(matched.rules.len(), 1);
    // The text as written is not what a request's bytes become.
    assert!(!rules.has_domain("\u{FFFD}weird"));
}
