//! Calendar windows come from the IANA database bundled in the binary,
//! whatever the host's zoneinfo says (issue 22: a crafted TZDIR moved a New
//! York day to Tokyo's midnight).

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use crate::common::Tollgate;
use crate::common::envoy::http_with_body;

#[test]
fn a_crafted_tzdir_cannot_move_a_calendar_day() {
    let crafted = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(crafted.path().join("America")).expect("dir");
    let tokyo = std::fs::read("/usr/share/zoneinfo/Asia/Tokyo")
        .or_else(|_| std::fs::read("/usr/share/zoneinfo/Japan"));
    let Ok(tokyo) = tokyo else {
        panic!(
            "this test needs the host's /usr/share/zoneinfo/Asia/Tokyo (Debian: apt-get install tzdata)"
        );
    };
    std::fs::write(crafted.path().join("America/New_York"), tokyo).expect("write");
    let tzdir = crafted.path().to_string_lossy().into_owned();
    let server = Tollgate::start_with_env(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5, calendar: true, time_zone: America/New_York, algorithm: fixed_window}\n",
        &[],
        &[("TZDIR", &tzdir), ("TZ", "America/New_York")],
    );
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"x"}]}]}"#;
    let r = http_with_body(
        server.admin,
        "POST",
        "/json",
        &[("Content-Type", "application/json")],
        body,
    )
    .expect("answer");
    assert_eq!(r.status, 200, "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&r.body).expect("json");
    let reset: f64 = v["statuses"][0]["durationUntilReset"]
        .as_str()
        .and_then(|s| s.strip_suffix('s'))
        .and_then(|s| s.parse().ok())
        .expect("a duration");
    // New York's real next midnight, from the bundled database.
    let db = jiff::tz::TimeZoneDatabase::bundled();
    let ny = db.get("America/New_York").expect("zone");
    let now = jiff::Timestamp::now().to_zoned(ny);
    let midnight = now
        .date()
        .tomorrow()
        .expect("tomorrow")
        .to_zoned(now.time_zone().clone())
        .expect("midnight");
    let expected = (midnight.timestamp().as_second() - now.timestamp().as_second()) as f64;
    assert!(
        (reset - expected).abs() < 10.0,
        "the day ends in {reset} s by Tollgate, {expected} s in New York"
    );
}

/// A link and the zone it names are one zone: a reload that renames a
/// rule's zone from `America/New_York` to its link `US/Eastern` keeps the
/// rule's counters.
#[test]
fn renaming_a_zone_to_its_link_keeps_the_counters() {
    let rules = |zone: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: day, requests_per_unit: 5, calendar: true, time_zone: {zone}, algorithm: fixed_window}}\n"
        )
    };
    let server = Tollgate::start(&rules("America/New_York"), &[]);
    let remaining = || {
        let r = http_with_body(
            server.admin,
            "POST",
            "/json",
            &[("Content-Type", "application/json")],
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"x"}]}]}"#,
        )
        .expect("answer");
        let v: serde_json::Value = serde_json::from_str(&r.body).expect("json");
        v["statuses"][0]["limitRemaining"].as_u64().unwrap_or(0)
    };
    assert_eq!([remaining(), remaining(), remaining()], [4, 3, 2]);
    let loads = server.metric("ratelimit_service_config_load_success");
    std::fs::write(server.rules_path(), rules("US/Eastern")).expect("rewrite the rules");
    crate::common::wait_until(
        "the renamed zone is loaded",
        std::time::Duration::from_secs(10),
        || server.metric("ratelimit_service_config_load_success") > loads,
    );
    assert!(
        server.log_count("start from zero") == 0 && server.log_count("starts from zero") == 0,
        "no counter restart is reported"
    );
    assert_eq!(
        remaining(),
        1,
        "the same counter, under the zone's other name"
    );
}
