//! Calendar windows come from the IANA database bundled in the binary,
//! whatever the host's zoneinfo says (issue 22: a crafted TZDIR moved a New
//! York day to Tokyo's midnight).

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

mod common;

use common::Tollgate;
use common::envoy::http_with_body;

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
