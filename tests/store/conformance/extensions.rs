//! Scenarios for Tollgate's rule extensions: several limits per descriptor,
//! unit multipliers, calendar windows, budgets, quota mode and soft limits. They run on
//! every store like the rest of the suite.

use super::{Harness, with_hits};
use tollgate::clock::NANOS_PER_SEC;

fn header<'a>(d: &'a tollgate::limiter::Decision, name: &str) -> &'a str {
    d.headers
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, v)| v.as_str())
}

pub(crate) async fn several_limits_admit_only_when_all_do_and_report_the_deciding_one(h: &Harness) {
    let api: &[(&str, &str)] = &[("api", "key-1")];
    h.at(1.0);
    // 3 a second (bucket), 5 a minute (fixed), 100 an hour (sliding).
    let first = h.ask(&[api], 0).await;
    assert!(!first.over_limit);
    let status = &first.statuses[0];
    let limit = status.limit.as_ref().expect("a limit");
    assert_eq!(
        (&*limit.name, status.remaining),
        ("per_second", 2),
        "the least left decides"
    );
    assert_eq!(status.others.len(), 2, "the other two limits are reported");
    let policy = header(&first, "ratelimit-policy");
    assert!(
        policy.contains("\"per_second\";q=3;w=1")
            && policy.contains("\"per_minute\";q=5;w=60")
            && policy.contains("\"c.api/hour\";q=100;w=3600"),
        "every enforced limit is listed: {policy}"
    );
    assert_eq!(h.admitted(&[api], 5).await, 2, "the bucket holds 3");
    let refused = h.ask(&[api], 0).await;
    assert!(refused.over_limit);
    assert_eq!(
        refused.statuses[0].limit.as_ref().map(|l| &*l.name),
        Some("per_second"),
        "the refusing limit decides"
    );
    // Two seconds later the bucket has 3 again but the minute has 2 left.
    h.at(3.0);
    assert_eq!(h.admitted(&[api], 5).await, 2);
    let refused = h.ask(&[api], 0).await;
    assert!(refused.over_limit);
    let status = &refused.statuses[0];
    assert_eq!(status.limit.as_ref().map(|l| &*l.name), Some("per_minute"));
    // A refused request spent none of the others: the bucket still holds
    // the one token it had, the hour has 95 left.
    let bucket = status
        .others
        .iter()
        .find(|o| &*o.limit.name == "per_second")
        .expect("bucket reported");
    assert_eq!(bucket.remaining, 1);
    let hour = status
        .others
        .iter()
        .find(|o| &*o.limit.policy == "c.api/hour")
        .expect("hour reported");
    assert_eq!(hour.remaining, 95, "100 - 5 admitted");
    assert!(!bucket.over_limit && !hour.over_limit);
    // The minute resets; the bucket and the hour count on.
    h.at(61.0);
    assert_eq!(h.admitted(&[api], 10).await, 3);
}

pub(crate) async fn a_unit_multiplier_makes_five_minute_windows_for_every_algorithm(h: &Harness) {
    // Fixed: 3 per 5 minutes, windows at multiples of 300 s since the epoch
    // (the start hour is one).
    let fixed: &[(&str, &str)] = &[("five_fixed", "a")];
    h.at(299.0);
    assert_eq!(h.admitted(&[fixed], 5).await, 3);
    let refused = h.ask(&[fixed], 0).await;
    assert_eq!(
        refused.statuses[0].reset, NANOS_PER_SEC,
        "1 s to the window end"
    );
    assert!(header(&refused, "ratelimit-policy").contains(";q=3;w=300"));
    h.at(300.0);
    assert_eq!(h.admitted(&[fixed], 5).await, 3, "a new five-minute window");
    // Sliding: 10 per 5 minutes; half way through the next window half the
    // previous one still counts.
    let sliding: &[(&str, &str)] = &[("five_sliding", "a")];
    h.at(10.0);
    assert_eq!(h.admitted(&[sliding], 12).await, 10);
    h.at(299.0);
    assert_eq!(h.admitted(&[sliding], 12).await, 0, "the same window");
    h.at(450.0);
    assert_eq!(h.admitted(&[sliding], 12).await, 5, "10 * 0.5 counts");
    // Token bucket: 5 per 5 minutes is one token a minute.
    let bucket: &[(&str, &str)] = &[("five_bucket", "a")];
    h.at(1000.0);
    assert_eq!(h.admitted(&[bucket], 8).await, 5);
    let refused = h.ask(&[bucket], 0).await;
    assert_eq!(
        refused.statuses[0].reset,
        60 * NANOS_PER_SEC,
        "a token a minute"
    );
    h.at(1060.0);
    assert_eq!(h.admitted(&[bucket], 8).await, 1);
}

pub(crate) async fn calendar_months_reset_at_local_midnight_on_the_first(h: &Harness) {
    let monthly: &[(&str, &str)] = &[("monthly", "acme")];
    // 23:59 CEST on 31 March 2027 in Berlin (the month of the DST change).
    h.at_instant("2027-03-31T21:59:00Z");
    assert_eq!(h.admitted(&[monthly], 5).await, 3);
    let refused = h.ask(&[monthly], 0).await;
    assert!(refused.over_limit);
    assert_eq!(
        refused.statuses[0].reset,
        60 * NANOS_PER_SEC,
        "one minute to April in Berlin"
    );
    // March in Berlin is 31 days less the hour DST took.
    assert!(
        header(&refused, "ratelimit-policy").contains(";q=3;w=2674800"),
        "{}",
        header(&refused, "ratelimit-policy")
    );
    // 00:00 on 1 April in Berlin: a new month, though UTC is still in March.
    h.at_instant("2027-03-31T22:00:00Z");
    let april = h.ask(&[monthly], 0).await;
    assert!(!april.over_limit);
    assert_eq!(april.statuses[0].remaining, 2);
    assert_eq!(
        april.statuses[0].reset,
        30 * 86_400 * NANOS_PER_SEC,
        "April has 30 days"
    );
    // February 2028 is a leap month: 29 days from its first second.
    h.at_instant("2028-01-31T23:00:00Z");
    let feb = h.ask(&[monthly], 0).await;
    assert_eq!(feb.statuses[0].reset, 29 * 86_400 * NANOS_PER_SEC);
}

pub(crate) async fn calendar_days_follow_dst_in_their_time_zone(h: &Harness) {
    let daily: &[(&str, &str)] = &[("daily_ny", "acme")];
    // 14 March 2027 in New York lasts 23 hours (clocks skip 02:00-03:00).
    h.at_instant("2027-03-14T05:00:00Z");
    let first = h.ask(&[daily], 0).await;
    assert_eq!(first.statuses[0].reset, 23 * 3_600 * NANOS_PER_SEC);
    assert_eq!(h.admitted(&[daily], 3).await, 1);
    h.at_instant("2027-03-15T03:59:59Z");
    assert!(
        h.ask(&[daily], 0).await.over_limit,
        "still the 14th in New York"
    );
    h.at_instant("2027-03-15T04:00:00Z");
    assert_eq!(h.admitted(&[daily], 3).await, 2, "midnight EDT: a new day");
    // 7 November 2027 lasts 25 hours (clocks repeat 01:00-02:00).
    h.at_instant("2027-11-07T04:00:00Z");
    let long = h.ask(&[daily], 0).await;
    assert_eq!(long.statuses[0].reset, 25 * 3_600 * NANOS_PER_SEC);
}

pub(crate) async fn a_budget_admits_while_anything_is_left_and_charges_in_full(h: &Harness) {
    h.at(1.0);
    for key in ["tokens", "token_bucket_budget"] {
        let ask = |hits| async move {
            h.limiter
                .should_rate_limit(&with_hits(&[(key, "k")], hits))
                .await
                .expect("decided")
        };
        // Request time: a check; it spends nothing.
        let check = ask(0).await;
        assert!(!check.over_limit, "{key}");
        let full = check.statuses[0].remaining;
        assert_eq!(ask(0).await.statuses[0].remaining, full, "{key}");
        // Stream end: the response cost 55.
        let charged = ask(55).await;
        assert!(!charged.over_limit, "{key}");
        assert_eq!(charged.statuses[0].remaining, full - 55, "{key}");
        // The next response costs more than is left: charged anyway.
        let over = ask(500).await;
        assert!(
            !over.over_limit,
            "{key}: a charge is never refused while anything is left"
        );
        assert_eq!(over.statuses[0].remaining, 0, "{key}");
        // Now the budget is spent: the next request is refused at its check.
        let refused = ask(0).await;
        assert!(refused.over_limit, "{key}");
        // And a charge on an empty budget is refused, spending nothing.
        assert!(ask(10).await.over_limit, "{key}");
    }
    // The bucket was overdrawn: 55 + 60 (the 500 is capped at its capacity)
    // against 60, so at 1 token a second the next request waits 56 s.
    let check = |key: &'static str| async move {
        h.limiter
            .should_rate_limit(&with_hits(&[(key, "k")], 0))
            .await
            .expect("decided")
            .over_limit
    };
    h.at(56.0);
    assert!(
        check("token_bucket_budget").await,
        "the overdraft is still being repaid"
    );
    h.at(57.0);
    assert!(!check("token_bucket_budget").await, "repaid");
    // The fixed window is whole again in the next minute.
    assert!(check("tokens").await);
    h.at(61.0);
    assert!(!check("tokens").await);
}

pub(crate) async fn quota_mode_refuses_only_when_every_quota_descriptor_is_over(h: &Harness) {
    h.at(1.0);
    // quota_a allows 1, quota_b 2 a minute; org is an ordinary limit of 5.
    let both: &[&[(&str, &str)]] = &[
        &[("quota_a", "q")],
        &[("quota_b", "q")],
        &[("org", "quota")],
    ];
    let first = h.ask(both, 0).await;
    assert!(!first.over_limit);
    let second = h.ask(both, 0).await;
    assert!(!second.over_limit, "quota_b still admits");
    assert!(second.statuses[0].over_limit, "quota_a reports its refusal");
    assert!(!second.statuses[1].over_limit);
    let third = h.ask(both, 0).await;
    assert!(third.over_limit, "every quota descriptor is over");
    // The refused request spent nothing; the admitted ones spent org twice.
    let org = h.ask(&[&[("org", "quota")]], 0).await;
    assert_eq!(org.statuses[0].remaining, 2, "5 - 2 admitted - this one");
    // An ordinary limit still refuses on its own.
    let spent: &[&[(&str, &str)]] = &[&[("quota_b", "r")], &[("user", "quota")]];
    assert_eq!(h.admitted(spent, 4).await, 2, "user allows 2");
}

pub(crate) async fn a_soft_limit_admits_and_tags_and_spends_as_shadow_mode_does(h: &Harness) {
    h.at(1.0);
    let soft: &[(&str, &str)] = &[("soft", "s")];
    let org: &[(&str, &str)] = &[("org", "soft")];
    for i in 0..2 {
        let d = h.ask(&[soft, org], 0).await;
        assert!(!d.over_limit, "request {i}");
        assert!(
            d.request_headers.is_empty(),
            "request {i}: within the limit"
        );
    }
    for i in 0..2 {
        let d = h.ask(&[soft, org], 0).await;
        assert!(!d.over_limit && !d.statuses[0].over_limit, "request {i}");
        assert_eq!(
            d.request_headers,
            [("x-tollgate-over-limit", "soft".to_owned())],
            "request {i}"
        );
        assert_eq!(d.statuses[0].remaining, 0);
    }
    // Admitted: the other descriptor's budget was spent (5 - 4 - this one).
    assert_eq!(h.ask(&[org], 0).await.statuses[0].remaining, 0);
    // A hard limit over refuses: OVER_LIMIT, nothing tagged.
    let user: &[(&str, &str)] = &[("user", "soft")];
    assert_eq!(h.admitted(&[user], 2).await, 2);
    let d = h.ask(&[soft, user], 0).await;
    assert!(d.over_limit && d.request_headers.is_empty(), "{d:?}");
}
