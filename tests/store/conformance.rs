//! One conformance suite, every store: each scenario runs on the memory
//! store, on a real Redis and on a real three-master Redis Cluster, through
//! the limiter with a manual clock. After each Redis scenario, a SCAN of every
//! key finds none without an expiry.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer};
use tollgate::clock::{ManualClock, NANOS_PER_SEC, Nanos};
use tollgate::limiter::{Decision, Descriptor, Limiter, LimiterOptions, Request};
use tollgate::rules::RuleSet;
use tollgate::store::redis::{RedisOptions, RedisStore, RedisTarget};
use tollgate::store::{MemoryStore, MemoryStoreOptions, Store};

const RULES: &str = "domain: c
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: token_bucket, burst: 5}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: org
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: team
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: token_bucket}
  - key: watch
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: acct
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: api
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 3, algorithm: token_bucket}
      - {name: per_minute, unit: minute, requests_per_unit: 5, algorithm: fixed_window}
      - {unit: hour, requests_per_unit: 100, algorithm: sliding_window}
  - key: five_fixed
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3, algorithm: fixed_window}
  - key: five_sliding
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 10, algorithm: sliding_window}
  - key: five_bucket
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 5, algorithm: token_bucket}
  - key: monthly
    rate_limit: {unit: month, requests_per_unit: 3, calendar: true, time_zone: Europe/Berlin}
  - key: daily_ny
    rate_limit: {unit: day, requests_per_unit: 2, calendar: true, time_zone: America/New_York}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 100, budget: true, algorithm: fixed_window}
  - key: token_bucket_budget
    rate_limit: {unit: minute, requests_per_unit: 60, budget: true, algorithm: token_bucket}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: soft
    over_limit: tag
    rate_limit: {name: soft, unit: minute, requests_per_unit: 2}
";

#[path = "conformance/extensions.rs"]
mod extensions;
use extensions::*;

enum Backend {
    Memory,
    Redis(RedisServer),
    Cluster(RedisCluster),
}

struct Harness {
    limiter: Limiter,
    clock: ManualClock,
    start: Nanos,
    backend: Backend,
}

impl Harness {
    fn new(backend: Backend) -> Self {
        let rules = RuleSet::from_yaml(RULES).expect("rules");
        let start = crate::common::next_whole_hour();
        let clock = ManualClock::new(start);
        let store = match &backend {
            Backend::Memory => Store::Memory(MemoryStore::new(MemoryStoreOptions::default())),
            Backend::Redis(server) => {
                Store::Redis(redis_store(RedisTarget::Standalone(server.url())))
            }
            Backend::Cluster(cluster) => Store::Redis(redis_store(RedisTarget::Cluster(
                cluster.nodes.iter().map(|n| n.url()).collect(),
            ))),
        };
        let options = LimiterOptions {
            // A Redis failure here is a test failure, not a failure mode.
            unavailable_on_store_error: true,
            ..LimiterOptions::default()
        };
        let limiter = Limiter::new(rules, store, Arc::new(clock.clone()), options);
        Harness {
            limiter,
            clock,
            start,
            backend,
        }
    }

    /// Sets the clock to an RFC 3339 instant (in the future, so that Redis
    /// keeps keys whose expiry is computed from it).
    fn at_instant(&self, instant: &str) {
        let t: jiff::Timestamp = instant.parse().expect("an RFC 3339 instant");
        self.clock.set(t.as_nanosecond() as Nanos);
    }

    /// Sets the clock to `secs` after the start hour.
    fn at(&self, secs: f64) {
        self.clock
            .set(self.start + (secs * NANOS_PER_SEC as f64) as Nanos);
    }

    async fn ask(&self, descriptors: &[&[(&str, &str)]], hits: u32) -> Decision {
        let request = crate::common::limiter_request("c", descriptors, hits);
        self.limiter
            .should_rate_limit(&request)
            .await
            .expect("decided")
    }

    async fn admitted(&self, descriptors: &[&[(&str, &str)]], n: usize) -> usize {
        let mut admitted = 0;
        for _ in 0..n {
            if !self.ask(descriptors, 0).await.over_limit {
                admitted += 1;
            }
        }
        admitted
    }

    fn assert_every_key_expires(&self) {
        let keys = match &self.backend {
            Backend::Memory => return,
            Backend::Redis(server) => server.keys_with_ttl(),
            Backend::Cluster(cluster) => cluster.keys_with_ttl(),
        };
        assert!(!keys.is_empty(), "the scenario wrote counters");
        for (key, ttl) in keys {
            assert!(ttl > 0, "{key} has no expiry (PTTL {ttl})");
        }
    }
}

fn redis_store(target: RedisTarget) -> RedisStore {
    let mut options = RedisOptions::new(target);
    options.timeout = Duration::from_secs(2);
    RedisStore::new(options).expect("redis store")
}

async fn fixed_window_admits_twice_the_limit_across_a_boundary(h: &Harness) {
    h.at(59.5);
    assert_eq!(h.admitted(&[&[("fixed", "a")]], 8).await, 5);
    h.at(60.5);
    assert_eq!(h.admitted(&[&[("fixed", "a")]], 8).await, 5);
}

async fn sliding_window_admits_limit_plus_one_across_a_boundary(h: &Harness) {
    h.at(59.5);
    assert_eq!(h.admitted(&[&[("sliding", "a")]], 12).await, 10);
    h.at(60.5);
    assert_eq!(h.admitted(&[&[("sliding", "a")]], 12).await, 1);
    // Half way through, about half the window is back.
    h.at(90.0);
    assert_eq!(
        h.admitted(&[&[("sliding", "a")]], 12).await,
        4,
        "10 * 0.5 + 1 = 6 used of 10"
    );
}

async fn token_bucket_admits_a_burst_then_refills_at_the_rate(h: &Harness) {
    h.at(10.0);
    assert_eq!(h.admitted(&[&[("bucket", "a")]], 8).await, 5);
    let denied = h.ask(&[&[("bucket", "a")]], 0).await;
    assert!(denied.over_limit);
    assert_eq!(
        denied.statuses[0].reset, NANOS_PER_SEC,
        "one token a second"
    );
    h.at(12.0);
    assert_eq!(h.admitted(&[&[("bucket", "a")]], 8).await, 2);
    // A cost of 3 on an empty bucket waits for three tokens.
    h.at(15.0);
    assert!(!h.ask(&[&[("bucket", "a")]], 3).await.over_limit);
    assert!(h.ask(&[&[("bucket", "a")]], 3).await.over_limit);
}

async fn a_refused_request_spends_nothing_on_its_other_descriptors(h: &Harness) {
    h.at(1.0);
    // Three descriptors, so in Cluster they span several hash slots.
    let all: &[&[(&str, &str)]] = &[&[("org", "acme")], &[("team", "red")], &[("user", "ann")]];
    assert_eq!(h.admitted(all, 6).await, 2);
    let org = h.ask(&[&[("org", "acme")]], 0).await;
    assert_eq!(org.statuses[0].remaining, 2, "5 - 2 admitted - this one");
    let team = h.ask(&[&[("team", "red")]], 0).await;
    assert_eq!(
        team.statuses[0].remaining, 97,
        "100 - 2 admitted - this one: refused calls were refunded"
    );
    let refused = h.ask(all, 0).await;
    assert!(refused.over_limit);
    assert!(!refused.statuses[0].over_limit && refused.statuses[2].over_limit);
}

async fn hits_addend_counts_and_zero_only_checks(h: &Harness) {
    h.at(1.0);
    let d: &[&[(&str, &str)]] = &[&[("org", "hits")]];
    assert_eq!(h.ask(d, 3).await.statuses[0].remaining, 2);
    let mut check = Request {
        domain: "c",
        descriptors: [Descriptor {
            entries: [("org", "hits")].into_iter().collect(),
            hits_addend: Some(0),
            ..Descriptor::default()
        }]
        .into_iter()
        .collect(),
        hits_addend: 4,
    };
    let checked = h.limiter.should_rate_limit(&check).await.expect("decided");
    assert_eq!(
        (checked.over_limit, checked.statuses[0].remaining),
        (false, 2),
        "per-descriptor 0 wins"
    );
    assert!(h.ask(d, 3).await.over_limit, "3 more than the 2 left");
    check.descriptors[0].hits_addend = Some(2);
    assert!(
        !h.limiter
            .should_rate_limit(&check)
            .await
            .expect("decided")
            .over_limit
    );
    check.descriptors[0].hits_addend = Some(0);
    assert!(
        h.limiter
            .should_rate_limit(&check)
            .await
            .expect("decided")
            .over_limit,
        "exhausted"
    );
}

async fn shadow_mode_never_blocks_and_still_counts(h: &Harness) {
    h.at(1.0);
    for i in 0..4 {
        let d = h.ask(&[&[("watch", "w")], &[("org", "shadow")]], 0).await;
        assert!(!d.over_limit, "request {i}");
        assert_eq!(
            d.statuses[0].remaining, 0,
            "the shadow limit of 1 is spent, request {i}"
        );
        assert!(!d.statuses[0].over_limit);
    }
    assert_eq!(
        h.ask(&[&[("org", "shadow")]], 0).await.statuses[0].remaining,
        0,
        "5 - 4 - 1"
    );
}

async fn fifty_concurrent_requests_admit_exactly_the_limit(h: &Harness) {
    let h = Arc::new(h);
    for round in 0..5 {
        h.at(1.0 + f64::from(round));
        let key = format!("k{round}");
        let asks = (0..50).map(|_| {
            let key = key.clone();
            let h = h.clone();
            async move { !h.ask(&[&[("hot", key.as_str())]], 0).await.over_limit }
        });
        let admitted = futures_util::future::join_all(asks)
            .await
            .into_iter()
            .filter(|a| *a)
            .count();
        assert_eq!(admitted, 10, "round {round}");
    }
}

/// A request whose one descriptor carries its own `hits_addend`.
fn with_hits(entries: &[(&'static str, &'static str)], hits: u64) -> Request<'static> {
    Request {
        domain: "c",
        descriptors: [Descriptor {
            entries: entries.iter().copied().collect(),
            hits_addend: Some(hits),
            ..Descriptor::default()
        }]
        .into_iter()
        .collect(),
        hits_addend: 0,
    }
}

async fn a_hostile_hits_addend_is_refused_and_changes_nothing(h: &Harness) {
    h.at(1.0);
    let hostile = [
        u64::MAX,
        u64::MAX - 3,
        1 << 63,
        1 << 53,
        u64::from(u32::MAX) + 1,
        61,
    ];
    for key in ["fixed", "sliding", "bucket"] {
        let d: &[(&str, &str)] = &[(key, "x")];
        assert!(!h.ask(&[d], 2).await.over_limit, "{key}: two admitted");
        // A check (per-descriptor hits 0) reads what is left without spending.
        let left = || async {
            let out = h
                .limiter
                .should_rate_limit(&with_hits(&[(key, "x")], 0))
                .await;
            out.expect("decided").statuses[0].remaining
        };
        let before = left().await;
        for hits in hostile {
            let out = h
                .limiter
                .should_rate_limit(&with_hits(&[(key, "x")], hits))
                .await
                .expect("decided");
            assert!(out.over_limit, "{key}: {hits} hits are more than the limit");
            assert_eq!(out.statuses[0].remaining, before, "{key}: {hits}");
        }
        // The counter did not move: exactly what was left is still left.
        assert_eq!(
            left().await,
            before,
            "{key}: refused hits changed the counter"
        );
    }
}

async fn a_value_cannot_spend_another_descriptors_budget(h: &Harness) {
    h.at(1.0);
    // `acct=victim|path=/login` is one entry whose value looks like two.
    let forged: &[(&str, &str)] = &[("acct", "victim|path=/login")];
    assert_eq!(h.admitted(&[forged], 5).await, 2);
    let real: &[(&str, &str)] = &[("acct", "victim"), ("path", "/login")];
    assert_eq!(
        h.admitted(&[real], 5).await,
        2,
        "the victim's budget is whole"
    );
    // A brace cannot end the hash tag early either.
    let braces: &[(&str, &str)] = &[("acct", "a}b"), ("path", "{x")];
    assert_eq!(h.admitted(&[braces], 5).await, 2);
}

macro_rules! conformance {
    ($($scenario:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    let h = super::Harness::new(super::Backend::Memory);
                    super::$scenario(&h).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    let h = super::Harness::new(super::Backend::Redis(super::RedisServer::start()));
                    super::$scenario(&h).await;
                    h.assert_every_key_expires();
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $scenario() {
                    let h = super::Harness::new(super::Backend::Cluster(super::RedisCluster::start()));
                    super::$scenario(&h).await;
                    h.assert_every_key_expires();
                }
            )*
        }
    };
}

conformance!(
    fixed_window_admits_twice_the_limit_across_a_boundary,
    sliding_window_admits_limit_plus_one_across_a_boundary,
    token_bucket_admits_a_burst_then_refills_at_the_rate,
    a_refused_request_spends_nothing_on_its_other_descriptors,
    hits_addend_counts_and_zero_only_checks,
    shadow_mode_never_blocks_and_still_counts,
    fifty_concurrent_requests_admit_exactly_the_limit,
    a_hostile_hits_addend_is_refused_and_changes_nothing,
    a_value_cannot_spend_another_descriptors_budget,
    several_limits_admit_only_when_all_do_and_report_the_deciding_one,
    a_unit_multiplier_makes_five_minute_windows_for_every_algorithm,
    calendar_months_reset_at_local_midnight_on_the_first,
    calendar_days_follow_dst_in_their_time_zone,
    a_budget_admits_while_anything_is_left_and_charges_in_full,
    quota_mode_refuses_only_when_every_quota_descriptor_is_over,
    a_soft_limit_admits_and_tags_and_spends_as_shadow_mode_does,
);
