//! The rule shapes a request counter can't express: priority lanes
//! (`lanes:`: how a descriptor with a lane entry matches, and every way a
//! lane can be written wrong) and the sliding log's bounds.

use std::path::PathBuf;

use super::*;

const LANES: &str = "domain: d
descriptors:
  - key: org
    rate_limit: {unit: minute, requests_per_unit: 50}
    lanes: {key: priority, shares: {background: 60, batch: 20}}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
";

#[test]
fn a_last_entry_of_the_lane_key_names_the_lane_of_the_nodes_own_limit() {
    let rules = RuleSet::from_yaml(LANES).expect("loads");
    let lane = |entries: &[(&str, &str)]| rules.lookup("d", entries).map(|m| m.lane);
    assert_eq!(lane(&[("org", "a")]), Some(None), "no lane entry");
    assert_eq!(
        lane(&[("org", "a"), ("priority", "background")]),
        Some(Some(60))
    );
    assert_eq!(lane(&[("org", "a"), ("priority", "batch")]), Some(Some(20)));
    assert_eq!(
        lane(&[("org", "a"), ("priority", "live")]),
        Some(Some(100)),
        "not listed"
    );
    assert_eq!(
        lane(&[("org", "a"), ("user", "u")]),
        Some(None),
        "a child is a child"
    );
    // Only last, and only once.
    assert_eq!(
        lane(&[("org", "a"), ("priority", "batch"), ("user", "u")]),
        None
    );
    assert_eq!(
        lane(&[("org", "a"), ("priority", "a"), ("priority", "b")]),
        None
    );
    let m = rules
        .lookup("d", &[("org", "a"), ("priority", "batch")])
        .expect("matches");
    assert_eq!(m.rules[0].path, "d.org", "the node's own rule");
}

#[test]
fn a_lanes_limit_is_its_share_of_the_count_or_of_a_buckets_capacity() {
    use crate::algorithm::Algorithm;
    let window = Limit::per_unit(50, Unit::Minute, Algorithm::FixedWindow);
    assert_eq!(window.in_lane(60).requests_per_unit, 30);
    assert_eq!(window.in_lane(100), window);
    assert_eq!(window.in_lane(1).requests_per_unit, 0, "no room: refused");
    let bucket = Limit {
        burst: 10,
        ..Limit::per_unit(50, Unit::Minute, Algorithm::TokenBucket)
    };
    let lane = bucket.in_lane(60);
    assert_eq!(
        (lane.requests_per_unit, lane.burst),
        (50, 6),
        "the rate stays"
    );
    assert_eq!(bucket.in_lane(5).requests_per_unit, 0, "less than a token");
}

#[test]
fn lanes_written_wrong_are_errors_with_their_line() {
    let cases = [
        ("lanes: {key: priority, shares: {a: 0}}", "share of 0%"),
        ("lanes: {key: priority, shares: {a: 101}}", "share of 101%"),
        ("lanes: {key: org, shares: {a: 50}}", "its own key 'org'"),
        (
            "lanes: {key: user, shares: {a: 50}}",
            "also a child descriptor's key",
        ),
        ("lanes: {key: priority}", "need shares"),
        ("lanes: {key: priority, shares: {}}", "need shares"),
        ("lanes: {shares: {a: 50}}", "need a key"),
        (
            "lanes: {key: priority, shares: {a: 50}, weights: {}}",
            "unknown field `weights`",
        ),
        ("lanes: {key: priority, shares: {a: -5}}", "is negative"),
    ];
    for (lanes, needle) in cases {
        let yaml = format!(
            "domain: d
descriptors:
  - key: org
    rate_limit: {{unit: minute, requests_per_unit: 50}}
    {lanes}
    descriptors:
      - key: user
        rate_limit: {{unit: minute, requests_per_unit: 5}}
"
        );
        let err = RuleSet::from_yaml(&yaml).expect_err(lanes).to_string();
        assert!(err.contains(needle), "{lanes}: {err}");
        assert!(err.contains(":3:") || err.contains(":5:"), "a line: {err}");
    }
    for limit in ["rate_limit: {unlimited: true}", "descriptors: [{key: x}]"] {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: org\n    {limit}\n    lanes: {{key: p, shares: {{a: 50}}}}\n"
        );
        let err = RuleSet::from_yaml(&yaml).expect_err(limit).to_string();
        assert!(err.contains("and it has none"), "{limit}: {err}");
    }
}

#[test]
fn a_sliding_log_is_bounded_by_name_and_never_leased() {
    use crate::algorithm::Algorithm;
    let one =
        |limit: &str| format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {limit}\n");
    let ok = RuleSet::from_yaml(&one(
        "{unit: hour, requests_per_unit: 1000, algorithm: sliding_log}",
    ))
    .expect("at the bound");
    assert_eq!(
        ok.rules()[0].limit.map(|l| l.algorithm),
        Some(Algorithm::SlidingLog)
    );
    let err = RuleSet::from_yaml(&one(
        "{unit: hour, requests_per_unit: 1001, algorithm: sliding_log}",
    ))
    .expect_err("above")
    .to_string();
    assert!(
        err.contains(":4:") && err.contains("--max-sliding-log") && err.contains("1000"),
        "{err}"
    );
    let raised = LoadOptions {
        max_sliding_log: 5_000,
        ..LoadOptions::default()
    };
    let text = one("{unit: hour, requests_per_unit: 1001, algorithm: sliding_log}");
    assert!(load_sources(&[(PathBuf::from("r.yaml"), text)], &raised).is_ok());
    let err = RuleSet::from_yaml(&one(
        "{unit: hour, requests_per_unit: 10, algorithm: sliding_log, consistency: leased, lease: 2}",
    ))
    .expect_err("leased")
    .to_string();
    assert!(err.contains("cannot be leased"), "{err}");
    // From --default-algorithm: said so.
    let by_default = LoadOptions {
        default_algorithm: Algorithm::SlidingLog,
        ..LoadOptions::default()
    };
    let text = one("{unit: hour, requests_per_unit: 5000}");
    let err = load_sources(&[(PathBuf::from("r.yaml"), text)], &by_default)
        .expect_err("above")
        .to_string();
    assert!(err.contains("by --default-algorithm"), "{err}");
    // `simulate --algorithm sliding-log`: a limit no log can hold keeps its own.
    let what_if = LoadOptions {
        algorithm_override: Some(Algorithm::SlidingLog),
        ..LoadOptions::default()
    };
    let text = format!(
        "{}  - key: small\n    rate_limit: {{unit: hour, requests_per_unit: 5}}\n",
        one("{unit: hour, requests_per_unit: 5000, algorithm: token_bucket}")
    );
    let rules = load_sources(&[(PathBuf::from("r.yaml"), text)], &what_if).expect("loads");
    let algorithms: Vec<_> = rules
        .rules()
        .iter()
        .filter_map(|r| r.limit.map(|l| l.algorithm))
        .collect();
    assert_eq!(algorithms, [Algorithm::TokenBucket, Algorithm::SlidingLog]);
}

#[test]
fn in_flight_and_reserve_are_checked_with_their_lines() {
    let one = |fields: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n    {fields}\n"
        )
    };
    for (fields, needle) in [
        (
            "in_flight: {limit: 0, max_hold_seconds: 60}",
            "limit of 0; it is 1 to 1000 (--max-held-ids",
        ),
        (
            "in_flight: {limit: 1001, max_hold_seconds: 60}",
            "--max-held-ids",
        ),
        ("in_flight: {limit: 5}", "needs max_hold_seconds"),
        ("in_flight: {max_hold_seconds: 5}", "needs a limit"),
        (
            "in_flight: {limit: 5, max_hold_seconds: 86401}",
            "max_hold_seconds 86401; it is 1 to 86400",
        ),
        (
            "in_flight: {limit: 5, max_hold_seconds: 60, when: now}",
            "unknown field",
        ),
        (
            "in_flight: {limit: 5, max_hold_seconds: 60}\n    descriptors: [{key: release, rate_limit: {unit: hour, requests_per_unit: 1}}]",
            "a child descriptor's key is 'release'",
        ),
    ] {
        let err = RuleSet::from_yaml(&one(fields))
            .expect_err(fields)
            .to_string();
        assert!(err.contains(needle), "{fields}: {err}");
        assert!(
            err.contains(":3:") || err.contains(":5:") || err.contains(":4:"),
            "a line: {err}"
        );
    }
    let budget =
        |limit: &str| format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {limit}\n");
    for (limit, needle) in [
        (
            "{unit: hour, requests_per_unit: 10, algorithm: fixed_window, reserve: true}",
            "without budget: true",
        ),
        (
            "{unit: hour, requests_per_unit: 10, algorithm: token_bucket, budget: true, reserve: true}",
            "needs algorithm: fixed_window",
        ),
        (
            "{unlimited: true, reserve: true}",
            "should not specify rate limit reserve",
        ),
    ] {
        let err = RuleSet::from_yaml(&budget(limit))
            .expect_err(limit)
            .to_string();
        assert!(
            err.contains(needle) && err.contains(":4:"),
            "{limit}: {err}"
        );
    }
    let ok = RuleSet::from_yaml(&budget(
        "{unit: month, calendar: true, requests_per_unit: 10, algorithm: fixed_window, budget: true, reserve: true}",
    ))
    .expect("a calendar budget reserves");
    assert_eq!(
        ok.rules()[0].limit.and_then(|l| l.held),
        Some(HeldKind::Reserve)
    );
}

#[test]
fn a_last_request_id_entry_matches_the_nodes_held_rules() {
    let rules = RuleSet::from_yaml(
        "domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: hour, requests_per_unit: 10}
      - {name: tokens, unit: hour, requests_per_unit: 99, algorithm: fixed_window, budget: true, reserve: true}
    in_flight: {limit: 5, max_hold_seconds: 60}
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1}
",
    )
    .expect("loads");
    let limits = |entries: &[(&str, &str)]| {
        rules.lookup("d", entries).map(|m| {
            (
                m.hold,
                m.rules
                    .iter()
                    .map(|r| r.limit.map_or(0, |l| l.requests_per_unit))
                    .collect::<Vec<_>>(),
            )
        })
    };
    assert_eq!(limits(&[("k", "a")]), Some((false, vec![10, 99])));
    assert_eq!(
        limits(&[("k", "a"), ("request_id", "x")]),
        Some((true, vec![5, 99]))
    );
    assert_eq!(
        limits(&[("k", "a"), ("release", "x")]),
        Some((true, vec![5]))
    );
    assert_eq!(
        limits(&[("k", "a"), ("settle", "x")]),
        Some((true, vec![99]))
    );
    assert_eq!(limits(&[("k", "a"), ("user", "u")]), Some((false, vec![1])));
    assert_eq!(
        limits(&[("plain", "p"), ("request_id", "x")]),
        Some((true, vec![]))
    );
    assert_eq!(
        limits(&[("k", "a"), ("request_id", "x"), ("user", "u")]),
        None
    );
}

#[test]
fn check_envoy_config_reaches_the_held_rules_through_their_last_entry() {
    let rules = RuleSet::from_yaml(
        "domain: d
descriptors:
  - key: k
    in_flight: {limit: 5, max_hold_seconds: 60}
  - key: t
    rate_limit: {name: tokens, unit: hour, requests_per_unit: 99, algorithm: fixed_window, budget: true, reserve: true}
",
    )
    .expect("loads");
    let entry = |key| ShapeEntry {
        key,
        value: None,
        optional: false,
    };
    let reached = |shape: &[ShapeEntry<'_>]| {
        rules
            .reachable("d", shape)
            .iter()
            .map(|r| r.policy_name.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        reached(&[entry("k"), entry("request_id")]),
        ["d.k/in_flight"]
    );
    assert_eq!(reached(&[entry("k"), entry("release")]), ["d.k/in_flight"]);
    assert_eq!(reached(&[entry("t"), entry("settle")]), ["tokens"]);
    assert_eq!(reached(&[entry("t"), entry("request_id")]), ["tokens"]);
    assert!(reached(&[entry("k"), entry("settle")]).is_empty());
}

#[test]
fn a_reload_of_a_node_with_a_cap_reports_no_restart_for_either() {
    let text = |hold: u32| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: 10}}\n    in_flight: {{limit: 5, max_hold_seconds: {hold}}}\n"
        )
    };
    let before = RuleSet::from_yaml(&text(60)).expect("loads");
    let after = RuleSet::from_yaml(&text(600)).expect("loads");
    assert!(restarted_counters(&before, &before).is_empty());
    assert!(
        restarted_counters(&before, &after).is_empty(),
        "the cap keeps its slots"
    );
}
