//! Fewer Redis calls, same decisions, on a real Redis with a manual clock.
//!
//! Leases (`consistency: leased`): two Tollgate instances (two limiters with
//! stores of their own) on one Redis. Leased hits are counted in Redis when
//! granted, so the limit holds exactly; a hot key costs a script call per
//! lease instead of per request; an instance that dies holding a lease
//! strands at most its lease until the window ends; a refused request spends
//! nothing.
//!
//! Coalescing: requests queued behind a call that Redis holds past their
//! deadline time out, and the queue recovers. (That shared calls decide
//! exactly as one call per request is `tests/store/differential.rs`.)

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::RedisServer;
use tollgate::clock::{Clock, ManualClock, NANOS_PER_SEC};
use tollgate::limiter::{Limiter, LimiterOptions, Request};
use tollgate::rules::RuleSet;
use tollgate::store::Store;
use tollgate::store::redis::{BatchBounds, RedisOptions, RedisStore, RedisTarget};

const RULES: &str = "domain: l
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window, consistency: leased, lease: 10}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window, consistency: leased, lease: 10}
  - key: gate
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: fixed_window}
";

fn instance(redis: &RedisServer, clock: &ManualClock) -> Limiter {
    instance_with(redis, clock, RULES)
}

/// A Tollgate instance on `rules` (one file's text).
fn instance_with(redis: &RedisServer, clock: &ManualClock, rules: &str) -> Limiter {
    let mut options = RedisOptions::new(RedisTarget::Standalone(redis.url()));
    options.timeout = Duration::from_secs(2);
    instance_on(options, clock, rules)
}

/// A Tollgate instance on `rules` (one file's text) with the Redis `options`.
fn instance_on(options: RedisOptions, clock: &ManualClock, rules: &str) -> Limiter {
    let rules = RuleSet::from_yaml(rules).expect("rules");
    let store = Store::Redis(RedisStore::new(options).expect("store"));
    let options = LimiterOptions {
        unavailable_on_store_error: true,
        ..LimiterOptions::default()
    };
    Limiter::new(rules, store, Arc::new(clock.clone()), options)
}

fn request<'a>(descriptors: &[&[(&'a str, &'a str)]]) -> Request<'a> {
    crate::common::limiter_request("l", descriptors, 0)
}

async fn admitted(limiter: &Limiter, descriptors: &[&[(&str, &str)]], n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let d = limiter
            .should_rate_limit(&request(descriptors))
            .await
            .expect("decided");
        admitted += usize::from(!d.over_limit);
    }
    admitted
}

fn start_clock() -> ManualClock {
    ManualClock::new(crate::common::next_whole_hour() + NANOS_PER_SEC)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_admit_exactly_the_limit_in_a_call_per_lease() {
    for key in ["hot", "sliding"] {
        let redis = RedisServer::start();
        let clock = start_clock();
        let (a, b) = (instance(&redis, &clock), instance(&redis, &clock));
        let d: &[&[(&str, &str)]] = &[&[(key, "k")]];
        let before = redis.calls("evalsha") + redis.calls("eval");
        let mut total = 0;
        // Alternating, and far past the limit.
        for _ in 0..75 {
            total += admitted(&a, d, 1).await + admitted(&b, d, 1).await;
        }
        let calls = redis.calls("evalsha") + redis.calls("eval") - before;
        assert_eq!(total, 100, "{key}: leased hits are counted when granted");
        // 100 admitted in leases of 10 (11 hits a call: the request and its
        // grab), then one call per refused request near and past the limit.
        assert!(calls <= 70, "{key}: {calls} script calls for 150 requests");
        assert!(
            redis.keys_with_ttl().iter().all(|(_, ttl)| *ttl > 0),
            "{key}: every key expires"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_refill_a_lease_once_so_at_most_one_lease_is_unspent() {
    let redis = RedisServer::start();
    let clock = start_clock();
    let rules = "domain: l\ndescriptors:\n  - key: big\n    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: fixed_window, consistency: leased, lease: 10}\n";
    let limiter = Arc::new(instance_with(&redis, &clock, rules));
    // 64 requests in flight at a time, 20 rounds each.
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            let d: &[&[(&str, &str)]] = &[&[("big", "k")]];
            admitted(&limiter, d, 20).await
        }));
    }
    let mut admitted_total = 0;
    for t in tasks {
        admitted_total += t.await.expect("task");
    }
    assert_eq!(admitted_total, 64 * 20);
    let keys = redis.counter_names();
    let key = keys
        .lines()
        .find(|k| k.contains("big"))
        .expect("the counter");
    let counted: u64 = redis.cli(&["GET", key]).trim().parse().expect("a count");
    assert!(
        counted >= admitted_total as u64,
        "{keys}: {counted} counted, {admitted_total} admitted"
    );
    let unspent = counted - admitted_total as u64;
    // One instance holds at most one lease of 10 (the README's bound);
    // before one refill per key, concurrent misses each took their own.
    assert!(
        unspent <= 10,
        "{unspent} hits counted in Redis and not admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_dies_holding_a_lease_strands_at_most_its_lease() {
    let redis = RedisServer::start();
    let clock = start_clock();
    let d: &[&[(&str, &str)]] = &[&[("hot", "k")]];
    {
        let a = instance(&redis, &clock);
        // One request: its hit and a lease of 10 are counted in Redis.
        assert_eq!(admitted(&a, d, 1).await, 1);
        // `a` dies here, holding 10 unused hits.
    }
    let b = instance(&redis, &clock);
    assert_eq!(
        admitted(&b, d, 200).await,
        89,
        "100 - 1 used - 10 stranded: fewer admissions, never more"
    );
    // The stranded hits come back with the next window.
    clock.set(clock.now() + 3_600 * NANOS_PER_SEC);
    assert_eq!(admitted(&b, d, 200).await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_spends_nothing_of_a_lease() {
    let redis = RedisServer::start();
    let clock = start_clock();
    let a = instance(&redis, &clock);
    let hot: &[(&str, &str)] = &[("hot", "k")];
    // A lease is taken (1 + 10 counted in Redis), then `gate` (1 an hour)
    // is spent.
    assert_eq!(admitted(&a, &[hot, &[("gate", "g")]], 1).await, 1);
    // Refused by `gate`: the hot key's hit, served from the lease, is given back.
    assert_eq!(admitted(&a, &[hot, &[("gate", "g")]], 5).await, 0);
    // 99 are left for the hot key, in Redis and in the lease together.
    assert_eq!(admitted(&a, &[hot], 200).await, 99);
}

/// Requests queued behind a call that Redis holds past their deadline: all
/// time out (the store's error, not a wrong answer), and the queue is not
/// left stuck: the next requests are decided by Redis again, exactly.
#[tokio::test(flavor = "current_thread")]
async fn requests_queued_behind_a_stalled_call_time_out_and_the_queue_recovers() {
    let redis = RedisServer::start();
    let clock = start_clock();
    let limiter = stalling_instance(&redis, &clock, BatchBounds::default()).await;
    let d: &[&[(&str, &str)]] = &[&[("gate", "stall")]];
    let stall = redis.stall("0.5");
    let request = crate::common::limiter_request("l", d, 0);
    let stalled =
        futures_util::future::join_all((0..30).map(|_| limiter.should_rate_limit(&request))).await;
    assert!(
        stalled.iter().all(|r| r.is_err()),
        "every request behind the stalled call timed out: {stalled:?}"
    );
    assert_eq!(stall.join(), "OK");
    // Redis answers again: the limit of 1 is decided exactly. (A stalled
    // call may still have run once Redis woke up, spending the hit.)
    let after =
        futures_util::future::join_all((0..10).map(|_| limiter.should_rate_limit(&request))).await;
    let admitted = after
        .iter()
        .map(|r| r.as_ref().expect("decided by Redis"))
        .filter(|d| !d.over_limit)
        .count();
    assert!(admitted <= 1, "{admitted} admitted of a limit of 1");
}

/// A connected instance with a Redis bound of 100 ms and `batch` bounds.
async fn stalling_instance(
    redis: &RedisServer,
    clock: &ManualClock,
    batch: BatchBounds,
) -> Limiter {
    let mut options = RedisOptions::new(RedisTarget::Standalone(redis.url()));
    options.timeout = Duration::from_millis(100);
    options.batch = batch;
    let limiter = instance_on(options, clock, RULES);
    // Connect and load the script first.
    assert!(admitted(&limiter, &[&[("gate", "warm")]], 1).await == 1);
    limiter
}

/// The Redis bound holds for each request from when it asked, however many
/// calls are queued ahead of it: with one request per call, eight requests
/// behind a stalled call are all answered (with a timeout) by about one
/// bound, not one bound per call ahead (800 ms).
#[tokio::test(flavor = "current_thread")]
async fn a_request_queued_behind_several_calls_is_answered_by_its_own_deadline() {
    let redis = RedisServer::start();
    let clock = start_clock();
    let one_per_call = BatchBounds {
        requests: 1,
        ..BatchBounds::default()
    };
    let limiter = stalling_instance(&redis, &clock, one_per_call).await;
    let stall = redis.stall("1");
    let request = crate::common::limiter_request("l", &[&[("gate", "queued")]], 0);
    let asked = std::time::Instant::now();
    let answers =
        futures_util::future::join_all((0..8).map(|_| limiter.should_rate_limit(&request))).await;
    let took = asked.elapsed();
    assert!(
        answers.iter().all(|r| r.is_err()),
        "every request timed out: {answers:?}"
    );
    assert!(
        took < Duration::from_millis(400),
        "answered after {took:?}: the 100 ms bound is per request"
    );
    assert_eq!(stall.join(), "OK");
}

/// A window counter is created by `SET ... PXAT` and afterwards only
/// `INCRBY`'d (cheaper for Redis, and it keeps the expiry): the expiry stays
/// the one its window fixes — the window's end for a fixed window, the end
/// of the next window for a sliding one (it counts as the previous window
/// there) — and the value counts every hit, whichever command wrote it.
#[tokio::test(flavor = "current_thread")]
async fn window_counters_keep_the_expiry_their_window_fixes() {
    const WINDOWS: &str = "domain: w
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_window}
";
    let redis = RedisServer::start();
    let hour = crate::common::next_whole_hour();
    let clock = ManualClock::new(hour);
    let limiter = instance_with(&redis, &clock, WINDOWS);
    // Three requests in the first minute of the hour, one call each: the
    // first creates each key, the next two add to it.
    for (at, hits) in [(1, 1), (20, 2), (59, 3)] {
        clock.set(hour + at * NANOS_PER_SEC);
        let request =
            crate::common::limiter_request("w", &[&[("fixed", "x")], &[("sliding", "x")]], hits);
        let decided = limiter.should_rate_limit(&request).await.expect("decided");
        assert!(!decided.over_limit);
    }
    assert_eq!(redis.calls("incrby"), 4, "two later writes of two keys");
    let hour_ms = hour / 1_000_000;
    let mut seen = 0;
    for (key, _) in redis.counters_with_ttl() {
        let expires: u64 = redis
            .cli(&["PEXPIRETIME", &key])
            .trim()
            .parse()
            .expect("an expiry");
        let value = redis.cli(&["GET", &key]);
        assert_eq!(value.trim(), "6", "{key}: 1 + 2 + 3 hits");
        if key.contains(":fw:") {
            assert_eq!(expires, hour_ms + 60_000, "{key}: the window's end");
        } else {
            assert!(key.contains(":sw:"), "{key}");
            assert_eq!(expires, hour_ms + 120_000, "{key}: the next window's end");
        }
        seen += 1;
    }
    assert_eq!(seen, 2, "one key per window counter");

    // A value Lua reads as a number but INCRBY refuses (written by anything
    // but Tollgate, without an expiry): rewritten with SET ... PXAT, never an
    // error that would fail every request of the call.
    for (key, _) in redis.counters_with_ttl() {
        assert_eq!(redis.cli(&["SET", &key, "1e1"]).trim(), "OK");
    }
    clock.set(hour + 59_500 * 1_000_000);
    let request = crate::common::limiter_request("w", &[&[("fixed", "x")], &[("sliding", "x")]], 1);
    let decided = limiter.should_rate_limit(&request).await.expect("decided");
    assert!(!decided.over_limit);
    for (key, ttl) in redis.counters_with_ttl() {
        assert!(ttl > 0, "{key} has its expiry again");
        assert_eq!(redis.cli(&["GET", &key]).trim(), "11", "{key}: 10 + 1");
    }
}

/// A call that carries a request of several checks and then one-check
/// requests on one of its keys counts every hit: the one-check requests
/// used to read the several-check request's held-back values (stale after
/// it committed), so each counted from the same number and hits were lost.
#[tokio::test(flavor = "current_thread")]
async fn one_check_requests_after_a_several_check_request_in_one_call_count_every_hit() {
    let redis = RedisServer::start();
    let clock = start_clock();
    let rules = "domain: l\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}\n  - key: gate\n    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}\n";
    let mut options = RedisOptions::new(RedisTarget::Standalone(redis.url()));
    options.timeout = Duration::from_secs(3);
    let limiter = Arc::new(instance_on(options, &clock, rules));
    assert_eq!(admitted(&limiter, &[&[("gate", "warm")]], 1).await, 1);
    // Redis held: the next request goes out alone and waits; the ones
    // after it queue and go together in one call.
    let stall = redis.stall("0.3");
    let first = {
        let limiter = limiter.clone();
        tokio::spawn(async move { admitted(&limiter, &[&[("gate", "g")]], 1).await })
    };
    tokio::task::yield_now().await;
    let pair = {
        let limiter = limiter.clone();
        tokio::spawn(async move { admitted(&limiter, &[&[("a", "k")], &[("b", "k")]], 1).await })
    };
    tokio::task::yield_now().await;
    let mut singles = Vec::new();
    for _ in 0..5 {
        let limiter = limiter.clone();
        singles.push(tokio::spawn(async move {
            admitted(&limiter, &[&[("a", "k")]], 1).await
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(first.await.expect("first"), 1);
    assert_eq!(pair.await.expect("pair"), 1);
    for s in singles {
        assert_eq!(s.await.expect("single"), 1);
    }
    assert_eq!(stall.join(), "OK");
    let keys = redis.counter_names();
    let a = keys
        .lines()
        .find(|k| k.contains("{l|a=k}"))
        .expect("a's counter");
    assert_eq!(
        redis.cli(&["GET", a]).trim(),
        "6",
        "1 from the pair and 5 alone"
    );
}
