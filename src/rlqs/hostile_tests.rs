//! The quota service against hostile reports: every bound holds, and one
//! client cannot grab or spend what others share.

use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;

use super::tests::*;
use super::*;

#[test]
fn hostile_reports_are_bounded() {
    let (q, _, _) = quotas(QuotaOptions {
        max_buckets: 2,
        max_entries: 2,
        max_value_bytes: 16,
        max_streams: 1,
        ..QuotaOptions::default()
    });
    let (a, _rx) = q.open(None).expect("opens");
    let refused = q.open(Some("another")).expect_err("one stream at most");
    {
        // A name is cut to its first MAX_CLIENT_NAME characters.
        let (q, _, _) = quotas(QuotaOptions::default());
        let (id, _rx) = q.open(Some(&"é".repeat(100_000))).expect("opens");
        q.answer(id, &report(vec![usage(&[("api_key", "k")], 1, 0, 0)]))
            .expect("answers");
        let json = q.to_json(1);
        let name = json["streams"][0]["client"].as_str().expect("name");
        assert_eq!(name.chars().count(), MAX_CLIENT_NAME);
    }
    assert_eq!(refused, QuotaError::TooManyStreams { open: 1 });
    let status = tonic::Status::from(refused);
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status.message().contains("--rlqs-max-streams"),
        "{}",
        status.message()
    );
    let long = "x".repeat(17);
    let r = q
        .answer(
            a,
            &report(vec![
                usage(&[], 1, 0, 0),
                usage(&[("a", "1"), ("b", "2"), ("c", "3")], 1, 0, 0),
                usage(&[("api_key", &long)], 1, 0, 0),
                BucketQuotaUsage::default(),
                usage(&[("api_key", "k1")], u64::MAX, u64::MAX, i64::MAX),
                usage(&[("api_key", "k2")], 1, 0, -5),
                usage(&[("api_key", "k3")], 1, 0, 0),
            ]),
        )
        .expect("present");
    let all = actions(&r);
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(all.contains_key("api_key=k1") && all.contains_key("api_key=k2"));
    assert_eq!(
        q.metrics
            .buckets_refused
            .load(std::sync::atomic::Ordering::Relaxed),
        5
    );
    // One stream, one domain.
    let err = q
        .answer(
            a,
            &RateLimitQuotaUsageReports {
                domain: "other".into(),
                bucket_quota_usages: vec![],
            },
        )
        .expect_err("an error");
    assert_eq!(
        err,
        QuotaError::OtherDomain {
            started: "rlqs".into(),
            this: "other".into()
        }
    );
    let status = tonic::Status::from(err);
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("one domain"),
        "{}",
        status.message()
    );
    let err = q
        .answer(a, &RateLimitQuotaUsageReports::default())
        .expect_err("an error");
    assert_eq!(err, QuotaError::NoDomain);
    assert_eq!(
        tonic::Status::from(err).code(),
        tonic::Code::InvalidArgument
    );
    let err = q
        .answer(
            a,
            &RateLimitQuotaUsageReports {
                domain: "d".repeat(17),
                bucket_quota_usages: vec![],
            },
        )
        .expect_err("an error");
    assert_eq!(err, QuotaError::DomainTooLong { bytes: 17, max: 16 });
}

#[test]
fn a_bucket_keeps_a_bounded_number_of_departed_clients() {
    let (q, _, _) = quotas(QuotaOptions {
        max_streams: MAX_DEPARTED + 10,
        ..QuotaOptions::default()
    });
    let key = [("api_key", "k1")];
    // One client cycling names: each stream reports, then goes.
    for i in 0..MAX_DEPARTED + 5 {
        let (id, _rx) = q.open(Some(&format!("name-{i}"))).expect("opens");
        let r = q
            .answer(id, &report(vec![usage(&key, 1, 0, 5)]))
            .expect("answers");
        assert_eq!(actions(&r).len(), 1, "every report is answered");
        q.close(id, q.now());
    }
    let json = q.to_json(1);
    assert_eq!(
        json["buckets"][0]["clients"]
            .as_array()
            .expect("clients")
            .len(),
        MAX_DEPARTED
    );
}

#[test]
fn one_report_cannot_grab_a_bucket_or_spend_its_window() {
    let (q, _, clock) = quotas(QuotaOptions::default());
    for key in [[("api_key", "k1")], [("plan", "daily")]] {
        let honest: Vec<_> = (0..2).map(|_| q.open(None).expect("opens")).collect();
        let (thief, _rx) = q.open(None).expect("opens");
        for (id, _) in &honest {
            q.answer(*id, &report(vec![usage(&key, 1, 0, 0)]))
                .expect("present");
        }
        q.answer(thief, &report(vec![usage(&key, 1, 0, 0)]))
            .expect("present");
        clock.advance(Duration::from_secs(1));
        q.answer(thief, &report(vec![usage(&key, u64::MAX, u64::MAX, 1)]))
            .expect("present");
        for (id, _) in &honest {
            clock.advance(Duration::from_millis(10));
            let r = q
                .answer(*id, &report(vec![usage(&key, 10, 0, 1)]))
                .expect("present");
            let answer = one(&r);
            assert_ne!(answer, "deny", "{key:?}: one report spent the window");
            let rate = rate_of(&answer);
            // The bucket's rate: 20/s, or 100 per minute. The honest
            // clients keep a real part of it (before: 1 token per hour).
            let floor = if key[0].0 == "plan" { 0.3 } else { 4.0 };
            assert!(rate >= floor, "{key:?}: an honest client gets {answer}");
        }
        clock.advance(Duration::from_secs(60));
        tick(&q);
    }
}

#[test]
fn buckets_nobody_reports_expire_and_junk_fills_nothing() {
    let (q, _, clock) = quotas(QuotaOptions {
        max_buckets_per_stream: 100,
        max_pairs: 150,
        ..QuotaOptions::default()
    });
    let (junk, _rx) = q.open(None).expect("opens");
    // Buckets no rule matches are answered and not kept.
    let nobody: Vec<BucketQuotaUsage> = (0..1_000)
        .map(|i| usage(&[("nobody", &i.to_string())], 1, 0, 0))
        .collect();
    let r = q.answer(junk, &report(nobody)).expect("present");
    assert_eq!(r.actions.len(), 1_000, "every one answered");
    assert_eq!(q.to_json(0)["buckets_total"], 0, "none kept");
    // Matched buckets: at most 100 for one stream, 150 for all.
    let keys: Vec<BucketQuotaUsage> = (0..1_000)
        .map(|i| usage(&[("api_key", &format!("junk{i}"))], 1, 0, 0))
        .collect();
    q.answer(junk, &report(keys.clone())).expect("present");
    assert_eq!(q.to_json(0)["buckets_total"], 100);
    let (other, _rx) = q.open(None).expect("opens");
    q.answer(other, &report(keys)).expect("present");
    assert_eq!(q.to_json(0)["buckets_total"], 100);
    assert_eq!(q.to_json(0)["pairs"], 150, "the other stream holds 50");
    // Refused buckets take no bytes: what is held is the 100 kept ones.
    let held: usize = (0..100)
        .map(|i| {
            let entries = [("api_key".to_string(), format!("junk{i}"))];
            super::bucket::Bucket::bytes_of(&super::bucket::bucket_name("rlqs", &entries))
        })
        .sum();
    assert_eq!(q.to_json(0)["bucket_bytes"].as_u64(), Some(held as u64));
    // The junk stream stays open and idle: its buckets expire all the same,
    // and a new API key gets its assignment.
    clock.advance(Duration::from_secs(16));
    tick(&q);
    assert_eq!(q.to_json(0)["buckets_total"], 0);
    assert_eq!(q.to_json(0)["pairs"], 0);
    let (honest, _rx) = q.open(None).expect("opens");
    let r = q
        .answer(honest, &report(vec![usage(&[("api_key", "new")], 1, 0, 0)]))
        .expect("present");
    assert_eq!(one(&r), "20/1s max 20");
}

#[test]
fn a_bucket_repeated_in_one_report_counts_once() {
    let (q, _, _) = quotas(QuotaOptions::default());
    let (a, _rx) = q.open(None).expect("opens");
    let key = [("plan", "daily")];
    let repeated: Vec<BucketQuotaUsage> = (0..3_000).map(|_| usage(&key, 0, 1, 0)).collect();
    let r = q.answer(a, &report(repeated)).expect("present");
    assert_eq!(r.actions.len(), 1);
    let json = q.to_json(1);
    assert_eq!(
        json["buckets"][0]["clients"].as_array().map(Vec::len),
        Some(1)
    );
}

#[test]
fn usage_counts_in_the_window_it_happened_in() {
    let (q, _, clock) = quotas(QuotaOptions::default());
    let key = [("plan", "daily")];
    let (a, _rx) = q.open(None).expect("opens");
    q.answer(a, &report(vec![usage(&key, 1, 0, 0)]))
        .expect("present");
    // 99 more admitted in the last 5 s of the minute, reported 1 s into the
    // next one: 1 of those 6 s is in the new window.
    clock.advance(Duration::from_secs(61));
    let r = q
        .answer(a, &report(vec![usage(&key, 96, 0, 6)]))
        .expect("present");
    assert_ne!(one(&r), "deny", "charged to the window it happened in");
    assert_eq!(q.to_json(1)["buckets"][0]["window_used"], 16);
}

#[test]
fn buckets_are_bounded_in_bytes_too() {
    let (q, _, clock) = quotas(QuotaOptions {
        max_bucket_bytes: 1_000_000,
        ..QuotaOptions::default()
    });
    let (a, _rx) = q.open(None).expect("opens");
    // 100 buckets of 60 KB values: about 120 KB each as held.
    let big: Vec<BucketQuotaUsage> = (0..100)
        .map(|i| {
            usage(
                &[("api_key", &format!("{i}{}", "v".repeat(60_000)))],
                1,
                0,
                0,
            )
        })
        .collect();
    q.answer(a, &report(big)).expect("present");
    let json = q.to_json(0);
    let kept = json["buckets_total"].as_u64().expect("count");
    assert!((7..=9).contains(&kept), "{kept} buckets of 120 KB in 1 MB");
    assert!(json["bucket_bytes"].as_u64().expect("bytes") <= 1_000_000);
    // Gone, they free their bytes.
    clock.advance(Duration::from_secs(16));
    tick(&q);
    assert_eq!(q.to_json(0)["bucket_bytes"], 0);
}

/// `--max-value-bytes` counts a bucket value's bytes as sent: one that was
/// not UTF-8 is up to four times longer once made text, and must not be
/// easier to push past the bound (its bucket left without an assignment).
#[test]
fn the_value_bound_counts_the_bytes_sent() {
    let (q, _, _) = quotas(QuotaOptions {
        max_value_bytes: 16,
        ..QuotaOptions::default()
    });
    let (a, _rx) = q.open(None).expect("opens");
    let sent = |n: usize| crate::wire_text::from_wire(vec![0xff; n]);
    let (at_bound, past) = (sent(16), sent(17));
    assert!(at_bound.len() > 16, "{at_bound:?} is longer as text");
    let r = q
        .answer(
            a,
            &report(vec![
                usage(&[("api_key", &at_bound)], 1, 0, 0),
                usage(&[("api_key", &past)], 1, 0, 0),
            ]),
        )
        .expect("present");
    let all = actions(&r);
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(
        all.keys().any(|k| k.contains(&at_bound)),
        "the 16 bytes sent are assigned: {all:?}"
    );
}
