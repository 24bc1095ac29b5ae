use jiff::Timestamp;

use super::*;

/// Ticks (µs) of an RFC 3339 instant.
fn at(instant: &str) -> u64 {
    let t: Timestamp = instant.parse().expect("a valid instant");
    u64::try_from(t.as_microsecond()).expect("after 1970")
}

fn calendar(unit: CalendarUnit, every: u32, zone: &str) -> Calendar {
    Calendar {
        unit,
        every,
        zone: Zone::get(zone).expect("a known zone"),
    }
}

const HOUR: u64 = 3_600_000_000;
const DAY: u64 = 24 * HOUR;

#[test]
fn months_have_their_real_lengths_and_leap_years_count() {
    let month = calendar(CalendarUnit::Month, 1, "UTC");
    let feb_2028 = month.window(at("2028-02-10T12:00:00Z"));
    assert_eq!(feb_2028.start, at("2028-02-01T00:00:00Z"));
    assert_eq!(feb_2028.end, at("2028-03-01T00:00:00Z"));
    assert_eq!(
        feb_2028.end - feb_2028.start,
        29 * DAY,
        "2028 is a leap year"
    );
    let feb_2027 = month.window(at("2027-02-28T23:59:59.999999Z"));
    assert_eq!(feb_2027.end - feb_2027.start, 28 * DAY);
    let jan = month.window(at("2027-01-31T23:59:59Z"));
    assert_eq!(jan.end - jan.start, 31 * DAY);
    // Consecutive months have consecutive numbers across a year's end.
    let dec = month.window(at("2026-12-31T23:59:59Z"));
    assert_eq!(dec.index + 1, jan.index);
    assert_eq!(dec.end, jan.start);
    // The last microsecond of a month is in it; the next is not.
    assert_eq!(
        month.window(at("2027-02-01T00:00:00Z")).index,
        jan.index + 1
    );
    assert_eq!(
        month.window(at("2027-01-31T23:59:59.999999Z")).index,
        jan.index
    );
}

#[test]
fn a_berlin_month_starts_at_local_midnight_and_spans_the_dst_change() {
    let month = calendar(CalendarUnit::Month, 1, "Europe/Berlin");
    // March 2027: CET (+01:00) until 28 March 02:00, then CEST (+02:00).
    let march = month.window(at("2027-03-15T00:00:00Z"));
    assert_eq!(
        march.start,
        at("2027-02-28T23:00:00Z"),
        "00:00 CET on the 1st"
    );
    assert_eq!(
        march.end,
        at("2027-03-31T22:00:00Z"),
        "00:00 CEST on 1 April"
    );
    assert_eq!(march.end - march.start, 31 * DAY - HOUR, "an hour shorter");
    // 23:30 UTC on 28 February is already March in Berlin.
    assert_eq!(month.window(at("2027-02-28T23:30:00Z")).index, march.index);
    assert_eq!(
        month.window(at("2027-02-28T22:59:59Z")).index,
        march.index - 1
    );
}

#[test]
fn days_across_dst_changes_are_23_and_25_hours() {
    let day = calendar(CalendarUnit::Day, 1, "America/New_York");
    // 2027-03-14: clocks jump from 02:00 to 03:00 EST -> EDT.
    let spring = day.window(at("2027-03-14T12:00:00Z"));
    assert_eq!(spring.start, at("2027-03-14T05:00:00Z"));
    assert_eq!(spring.end - spring.start, 23 * HOUR);
    // 2027-11-07: clocks fall back from 02:00 EDT to 01:00 EST.
    let autumn = day.window(at("2027-11-07T12:00:00Z"));
    assert_eq!(autumn.start, at("2027-11-07T04:00:00Z"));
    assert_eq!(autumn.end - autumn.start, 25 * HOUR);
}

#[test]
fn a_midnight_skipped_by_dst_starts_the_day_after_the_gap() {
    // Chile moved its clocks from 24:00 to 01:00 on 2022-09-11 (Santiago):
    // that day has no midnight; it starts at 01:00 -03, right after the gap.
    let day = calendar(CalendarUnit::Day, 1, "America/Santiago");
    let w = day.window(at("2022-09-11T12:00:00Z"));
    assert_eq!(w.start, at("2022-09-11T04:00:00Z"));
    assert_eq!(w.end - w.start, 23 * HOUR);
}

#[test]
fn weeks_start_on_monday() {
    let week = calendar(CalendarUnit::Week, 1, "UTC");
    // 2026-11-30 is a Monday.
    let w = week.window(at("2026-12-03T10:00:00Z"));
    assert_eq!(w.start, at("2026-11-30T00:00:00Z"));
    assert_eq!(w.end, at("2026-12-07T00:00:00Z"));
    assert_eq!(week.window(at("2026-11-29T23:59:59Z")).index + 1, w.index);
    // The first days of 1970 (Thursday to Sunday) are week 0.
    assert_eq!(week.window(at("1970-01-04T23:00:00Z")).index, 0);
    assert_eq!(week.window(at("1970-01-05T00:00:00Z")).index, 1);
}

#[test]
fn multiples_count_from_the_epoch() {
    let quarter = calendar(CalendarUnit::Month, 3, "UTC");
    let q = quarter.window(at("2027-05-20T00:00:00Z"));
    assert_eq!(q.start, at("2027-04-01T00:00:00Z"));
    assert_eq!(q.end, at("2027-07-01T00:00:00Z"));
    let two_days = calendar(CalendarUnit::Day, 2, "UTC");
    let w = two_days.window(at("1970-01-02T05:00:00Z"));
    assert_eq!((w.index, w.start, w.end), (0, 0, 2 * DAY));
    let year = calendar(CalendarUnit::Year, 1, "Asia/Tokyo");
    let y = year.window(at("2026-12-31T15:00:00Z"));
    assert_eq!(
        y.start,
        at("2026-12-31T15:00:00Z"),
        "00:00 JST on 1 January 2027"
    );
    assert_eq!(y.index, 2027);
}

#[test]
fn every_instant_is_inside_its_window() {
    for zone in [
        "UTC",
        "Europe/Berlin",
        "Australia/Lord_Howe",
        "Asia/Kathmandu",
    ] {
        for unit in [
            CalendarUnit::Day,
            CalendarUnit::Week,
            CalendarUnit::Month,
            CalendarUnit::Year,
        ] {
            let c = calendar(unit, 1, zone);
            let mut now = at("2027-01-01T00:00:00Z");
            let mut last: Option<Window> = None;
            // Every 7 hours through a year and a bit: windows tile time.
            while now < at("2028-03-01T00:00:00Z") {
                let w = c.window(now);
                assert!(w.start <= now && now < w.end, "{zone} {unit:?} {now}");
                if let Some(last) = last.filter(|l| l.index != w.index) {
                    assert_eq!(last.index + 1, w.index, "{zone} {unit:?}");
                    assert_eq!(last.end, w.start, "{zone} {unit:?}");
                }
                last = Some(w);
                now += 7 * HOUR;
            }
        }
    }
}

#[test]
fn zones_are_iana_names() {
    assert!(Zone::get("Europe/Berlin").is_ok());
    assert!(std::ptr::eq(
        Zone::get("Europe/Berlin").expect("known"),
        Zone::get("Europe/Berlin").expect("known")
    ));
    for bad in [
        "Mars/Olympus",
        "",
        "/etc/passwd",
        "../../etc/passwd",
        "EST5EDT,M3.2.0,M11.1.0",
    ] {
        let err = Zone::get(bad).expect_err(bad);
        assert!(err.contains("time zone"), "{err}");
    }
}

#[test]
fn zone_names_are_matched_without_case_and_the_hosts_own_is_refused() {
    let berlin = Zone::get("Europe/Berlin").expect("a zone");
    let lower = Zone::get("europe/berlin").expect("the same zone");
    assert!(std::ptr::eq(berlin, lower), "one zone, one set of counters");
    assert_eq!(lower.name(), "Europe/Berlin");
    // A link keeps its name as written, and is the zone it names: one
    // zone, one set of counters.
    let link = Zone::get("us/eastern").expect("a link");
    let zone = Zone::get("America/New_York").expect("its zone");
    assert_eq!(link.name(), "US/Eastern");
    assert_eq!(link.key(), zone.key());
    assert_eq!(link, zone);
    assert_ne!(
        Zone::get("Europe/Berlin").expect("a zone").key(),
        zone.key()
    );
    // The key is the zone's name, whichever name the rule uses.
    assert_eq!(zone.key(), "America/New_York");
    for (link, zone) in [
        ("Asia/Calcutta", "Asia/Kolkata"),
        ("Europe/Kiev", "Europe/Kyiv"),
        ("Atlantic/Jan_Mayen", "Europe/Berlin"),
        ("Japan", "Asia/Tokyo"),
    ] {
        assert_eq!(Zone::get(link).expect("a link").key(), zone, "{link}");
        assert_eq!(Zone::get(zone).expect("a zone").key(), zone);
    }
    for host in ["localtime", "LocalTime"] {
        let e = Zone::get(host).expect_err("host-dependent");
        assert!(e.contains("host"), "{e}");
    }
}
