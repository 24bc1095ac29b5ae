//! Redis under load and faults, against a real Redis: a Redis that is slow
//! but answers must never open the circuit (which hands every key to the
//! failure mode), and keys known to be over their limit stay refused while
//! Redis is down.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::time::Duration;

use crate::common::redis::RedisServer;
use crate::common::{Tollgate, ask, eventually, request, wait_until};

const RULES: &str =
    "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

fn user(name: &str) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    request("t", &[&[("user", name)]])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_redis_that_still_answers_never_opens_the_circuit() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = Tollgate::start(
        RULES,
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-timeout",
            "20ms",
            "--redis-breaker",
            "3",
        ],
    );
    let mut client = server.client().await;
    ask(&mut client, request("t", &[&[("user", "warm")]])).await;
    // Redis stalls for 300 ms (as under CPU contention, only longer): calls
    // time out, the breaker's threshold is reached, and its confirming PING
    // gets its answer once the stall ends, well within its 1 s.
    let stall = redis.stall("0.3");
    let mut calls = Vec::new();
    for i in 0..10 {
        let mut client = server.client().await;
        calls.push(tokio::spawn(async move {
            let user = format!("u{i}");
            ask(&mut client, request("t", &[&[("user", &user)]])).await
        }));
    }
    for call in calls {
        call.await.expect("call");
    }
    assert_eq!(stall.join(), "OK");
    assert!(
        server.metric("tollgate_store_timeouts_total") >= 3,
        "calls timed out"
    );
    // The breaker's confirming PING is answered: the circuit stays closed.
    wait_until(
        "the confirming PING's answer",
        Duration::from_secs(5),
        || server.metric("tollgate_store_circuit_checks_total{result=\"answered\"}") >= 1,
    );
    assert_eq!(
        server.metric("tollgate_store_circuit_checks_total{result=\"failed\"}"),
        0
    );
    assert_eq!(server.metric("tollgate_store_circuit_open"), 0);
    assert_eq!(server.metric("tollgate_store_circuit_open_total"), 0);
    assert_eq!(server.log_count("Redis unavailable"), 0);
    // Decided by Redis again: the limit of 1 holds.
    let codes = [
        ask(&mut client, request("t", &[&[("user", "after")]]))
            .await
            .overall_code,
        ask(&mut client, request("t", &[&[("user", "after")]]))
            .await
            .overall_code,
    ];
    assert_eq!(codes, [1, 2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_known_to_be_over_their_limit_stay_refused_while_redis_is_down() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let server = Tollgate::start(
        RULES,
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-timeout",
            "50ms",
            "--redis-probe-timeout",
            "100ms",
            "--over-limit-cache",
            "on",
        ],
    );
    let mut client = server.client().await;
    assert_eq!(ask(&mut client, user("ann")).await.overall_code, 1);
    assert_eq!(ask(&mut client, user("ann")).await.overall_code, 2);
    redis.kill();
    // Failures open the circuit (the probe cannot connect either).
    let mut i = 0;
    let opened = eventually(Duration::from_secs(10), async || {
        if server.metric("tollgate_store_circuit_open") != 0 {
            return true;
        }
        i += 1;
        ask(&mut client, user(&format!("other{i}"))).await;
        false
    })
    .await;
    assert!(opened, "the circuit did not open");
    // Other keys: the failure mode (allow). Ann: still refused, 50 times.
    assert_eq!(ask(&mut client, user("bob")).await.overall_code, 1);
    for _ in 0..50 {
        assert_eq!(ask(&mut client, user("ann")).await.overall_code, 2);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_needing_more_checks_than_the_bound_is_refused_naming_it() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = Tollgate::start(
        RULES,
        &["--store", "redis", "--redis-url", &url, "--max-checks", "3"],
    );
    let mut client = server.client().await;
    let three: Vec<[(&str, &str); 1]> = vec![[("user", "a")], [("user", "b")], [("user", "c")]];
    let d: Vec<&[(&str, &str)]> = three.iter().map(|x| x.as_slice()).collect();
    assert_eq!(ask(&mut client, request("t", &d)).await.overall_code, 1);
    let four: Vec<[(&str, &str); 1]> = vec![
        [("user", "a")],
        [("user", "b")],
        [("user", "c")],
        [("user", "d")],
    ];
    let d: Vec<&[(&str, &str)]> = four.iter().map(|x| x.as_slice()).collect();
    let refused = client
        .should_rate_limit(request("t", &d))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("--max-checks"),
        "{}",
        refused.message()
    );
    // Nothing of the refused request was spent: d is still fresh.
    assert_eq!(
        ask(&mut client, user("d")).await.statuses[0].limit_remaining,
        0
    );
    assert_eq!(ask(&mut client, user("d")).await.overall_code, 2);
}

/// The sum of the counters of keys whose names contain `needle`.
fn counted(redis: &RedisServer, needle: &str) -> u64 {
    redis
        .counter_names()
        .lines()
        .filter(|k| k.contains(needle))
        .map(|k| redis.cli(&["GET", k]).trim().parse::<u64>().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_times_out_spends_nothing_even_when_redis_runs_it_late() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = Tollgate::start(
        "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n",
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-timeout",
            "50ms",
            "--failure-mode",
            "deny",
        ],
    );
    let mut client = server.client().await;
    assert_eq!(ask(&mut client, user("warm")).await.overall_code, 1);
    // Redis stalls (a slow link would do the same): every call below times
    // out at Tollgate, is answered from the failure mode (deny), and then
    // runs in Redis once the stall ends.
    let stall = redis.stall("0.6");
    let mut calls = Vec::new();
    for _ in 0..10 {
        let mut client = server.client().await;
        calls.push(tokio::spawn(async move {
            ask(&mut client, user("late")).await.overall_code
        }));
    }
    for call in calls {
        assert_eq!(call.await.expect("call"), 2, "refused by the failure mode");
    }
    assert_eq!(stall.join(), "OK");
    // The late calls run in Redis after the stall, and so do their
    // cancellations: once none is pending, both have.
    wait_until("the cancellations", Duration::from_secs(10), || {
        server.metric("tollgate_store_cancellations_pending") == 0
    });
    assert!(
        server.metric("tollgate_store_cancellations_total{result=\"delivered\"}") >= 1,
        "the calls with no answer were cancelled"
    );
    assert_eq!(
        server.metric("tollgate_store_cancellations_total{result=\"abandoned\"}"),
        0
    );
    assert_eq!(
        counted(&redis, "user=late"),
        0,
        "refused requests spent nothing: {}",
        redis.counter_names()
    );
    assert_eq!(ask(&mut client, user("late")).await.overall_code, 1);
    assert_eq!(counted(&redis, "user=late"), 1, "and counting goes on");
}
