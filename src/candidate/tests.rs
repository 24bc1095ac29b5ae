use std::path::PathBuf;

use smallvec::smallvec;

use super::*;
use crate::clock::ManualClock;
use crate::limiter::{Descriptor, LimitOverride};
use crate::rules::{LoadOptions, Unit, load_sources};

const START: Nanos = 1_700_000_000 * NANOS_PER_SEC;

fn candidate(yaml: &str, max_keys: usize) -> (Candidate, Arc<ManualClock>) {
    let rules = load_sources(
        &[(PathBuf::from("c.yaml"), yaml.to_owned())],
        &LoadOptions::default(),
    )
    .expect("rules");
    let clock = Arc::new(ManualClock::new(START));
    let store = MemoryStoreOptions {
        max_keys,
        ..MemoryStoreOptions::default()
    };
    let c = Candidate::new(rules, clock.clone(), LimiterOptions::default(), store);
    (c, clock)
}

fn request<'a>(user: &'a str, org: &'a str) -> Request<'a> {
    Request {
        domain: "d",
        descriptors: smallvec![
            Descriptor {
                entries: smallvec![("user", user)],
                ..Descriptor::default()
            },
            Descriptor {
                entries: smallvec![("org", org)],
                ..Descriptor::default()
            },
        ],
        hits_addend: 0,
    }
}

const TWO_RULES: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: org\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

/// Issue 22: 19 requests of two rules each, 9 refused, were reported
/// as "22 requests, 0 refused" (hits per rule, refused never counted)
/// with a peak of 0 %.
#[test]
fn totals_count_requests_once_and_their_refusals() {
    let (c, _) = candidate(TWO_RULES, 1_000);
    for _ in 0..19 {
        c.compare(&request("ann", "acme"), false);
    }
    let outcome = c.outcome();
    assert_eq!(outcome.requests, 19);
    assert_eq!(outcome.refused, 9);
    let user = outcome
        .rules
        .iter()
        .find(|r| r.rule == "d.user")
        .expect("rule");
    assert_eq!((user.requests, user.refused), (19, 9));
    assert!((user.peak_usage - 1.0).abs() < 1e-9, "{}", user.peak_usage);
    let org = outcome
        .rules
        .iter()
        .find(|r| r.rule == "d.org")
        .expect("rule");
    assert!((org.peak_usage - 0.01).abs() < 1e-9, "{}", org.peak_usage);
}

/// The workers count apart (no shared lock) and every reader sees their
/// sum: bins of the same 10 s from two threads are one bin.
#[test]
fn counts_from_several_threads_are_merged_on_read() {
    let (c, clock) = candidate(TWO_RULES, 1_000);
    let c = Arc::new(c);
    let threads: Vec<_> = (0..3)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let user = format!("user{t}");
                for _ in 0..15 {
                    c.compare(&request(&user, "acme"), false);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    clock.advance(std::time::Duration::from_secs(10));
    c.compare(&request("user0", "acme"), true);
    let outcome = c.outcome();
    assert_eq!((outcome.requests, outcome.refused), (46, 16));
    let user = outcome
        .rules
        .iter()
        .find(|r| r.rule == "d.user")
        .expect("rule");
    assert_eq!((user.requests, user.refused), (46, 16));
    let busy: Vec<_> = user.series.iter().filter(|b| b.requests > 0).collect();
    assert_eq!(busy.len(), 2, "two bins: {busy:?}");
    assert_eq!((busy[0].requests, busy[0].refused), (45, 15));
    let json = c.to_json();
    assert_eq!(json["decisions"]["stricter"], 15);
    assert_eq!(json["decisions"]["same"], 31);
}

#[test]
fn a_clients_limit_override_is_no_candidate_rule() {
    let (c, _) = candidate(TWO_RULES, 1_000);
    let mut r = request("ann", "acme");
    r.descriptors[0].limit_override = Some(LimitOverride {
        requests_per_unit: 5,
        unit: Unit::Minute,
    });
    c.compare(&r, false);
    let rules: Vec<String> = c.outcome().rules.into_iter().map(|r| r.rule).collect();
    assert_eq!(rules, ["d.org"], "no 'override' row");
}

#[test]
fn the_candidate_store_keeps_the_live_stores_key_bound() {
    let (c, _) = candidate(TWO_RULES, 1_000);
    let users: Vec<String> = (0..5_000).map(|i| format!("u{i}")).collect();
    for user in &users {
        c.compare(&request(user, "acme"), false);
    }
    let store = c.limiter().store().as_memory().expect("a memory store");
    // The bound is per shard (max_keys / 256 shards, rounded up).
    assert!(store.len() <= 1_024, "{} keys of 5,001", store.len());
}

#[test]
fn the_report_is_bounded_and_rendered_once_per_bin() {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for i in 0..5_000 {
        yaml.push_str(&format!(
            "  - key: user\n    value: u{i}\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
        ));
    }
    let (c, _) = candidate(&yaml, 1_000_000);
    let users: Vec<String> = (0..5_000).map(|i| format!("u{i}")).collect();
    for user in &users {
        c.compare(&request(user, "x"), false);
        c.compare(&request(user, "x"), false);
    }
    let started = std::time::Instant::now();
    let page = c.report_html();
    assert!(page.len() < 2_000_000, "{} bytes", page.len());
    assert_eq!(page.matches("<svg").count(), REPORT_RULES);
    assert!(page.contains("of 5000 are shown"), "the note");
    let again = c.report_html();
    assert!(
        Arc::ptr_eq(&page, &again),
        "served again, not rendered again"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}
