//! The sliding log (`algorithm: sliding_log`, issue 42): exact on the
//! memory store, a real Redis and a real Redis Cluster. Many clients racing
//! for one key get exactly the limit; a refusal says when the oldest counted
//! hit leaves; a request refused by another hash slot spends nothing of the
//! log (the Cluster's refund).

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{Served, ask, request};

const RULES: &str = "domain: log
descriptors:
  - key: reset
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_log}
  - key: race
    rate_limit: {unit: hour, requests_per_unit: 50, algorithm: sliding_log}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 0}
";

/// Five password resets an hour, exactly; the sixth is told to wait until
/// the first leaves, about an hour.
async fn exact_with_the_wait_of_the_oldest(server: &Served) {
    let mut client = server.client().await;
    for i in 0..5 {
        let answer = ask(&mut client, request("log", &[&[("reset", "ann")]])).await;
        assert_eq!(answer.overall_code, Code::Ok as i32, "reset {i}");
        assert_eq!(answer.statuses[0].limit_remaining, 4 - i);
    }
    let refused = ask(&mut client, request("log", &[&[("reset", "ann")]])).await;
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    let wait = refused.statuses[0]
        .duration_until_reset
        .expect("a wait")
        .seconds;
    assert!(
        (3590..=3600).contains(&wait),
        "until the first leaves: {wait} s"
    );
    // hits_addend: three at once need three free places.
    let three = RateLimitRequest {
        hits_addend: 3,
        ..request("log", &[&[("reset", "bob")]])
    };
    assert_eq!(
        ask(&mut client, three.clone()).await.overall_code,
        Code::Ok as i32
    );
    assert_eq!(
        ask(&mut client, three).await.overall_code,
        Code::OverLimit as i32
    );
    let two = RateLimitRequest {
        hits_addend: 2,
        ..request("log", &[&[("reset", "bob")]])
    };
    assert_eq!(ask(&mut client, two).await.overall_code, Code::Ok as i32);
}

/// 16 clients, 10 requests each, one key of 50: exactly 50.
async fn racing_clients_get_exactly_the_limit(server: &Served) {
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for _ in 0..10 {
                let answer = ask(&mut client, request("log", &[&[("race", "r")]])).await;
                ok += usize::from(answer.overall_code == Code::Ok as i32);
            }
            ok
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.expect("client");
    }
    assert_eq!(admitted, 50);
}

/// A request whose other descriptor is refused spends nothing of the log,
/// whichever store (and, on a Cluster, slot) holds each.
async fn a_refused_request_spends_nothing(server: &Served) {
    let mut client = server.client().await;
    for _ in 0..4 {
        let both = request("log", &[&[("reset", "cy")], &[("closed", "x")]]);
        assert_eq!(
            ask(&mut client, both).await.overall_code,
            Code::OverLimit as i32
        );
    }
    for i in 0..5 {
        let answer = ask(&mut client, request("log", &[&[("reset", "cy")]])).await;
        assert_eq!(
            answer.overall_code,
            Code::Ok as i32,
            "request {i}: nothing was spent"
        );
    }
}

async fn everything(server: &Served) {
    exact_with_the_wait_of_the_oldest(server).await;
    racing_clients_get_exactly_the_limit(server).await;
    a_refused_request_spends_nothing(server).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sliding_log_on_the_memory_store() {
    everything(&Served::start(RULES, &[])).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sliding_log_on_redis_and_a_cluster() {
    let redis = RedisServer::start();
    let server = Served::on_redis(RULES, &redis.url(), &["--redis-timeout", "2s"]);
    everything(&server).await;
    let logs: Vec<String> = redis
        .counters_with_ttl()
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| k.contains(":sl:"))
        .collect();
    assert_eq!(logs.len(), 4, "one key per client's log: {logs:?}");

    values_no_script_wrote_read_as_an_empty_log(&redis, &server).await;

    let cluster = RedisCluster::start();
    let server = Served::on_cluster(RULES, &cluster.urls(), &["--redis-timeout", "2s"]);
    everything(&server).await;
}

/// A log key holding what no script wrote (an infinite or NaN time, hits
/// of zero, minus five or 2^40, times out of order, a string): read as an
/// empty log, so the request it shares a script call with is decided, not
/// failed; and rewritten with an expiry at its first admission.
async fn values_no_script_wrote_read_as_an_empty_log(redis: &RedisServer, server: &Served) {
    let poisons = [
        "{math.huge, 1}",
        "{0/0, 1}",
        "{1, 0}",
        "{1, -5}",
        "{1, 2^40}",
        "{2000, 1, 1000, 1}",
        "'not a log'",
    ];
    let mut client = server.client().await;
    for (i, poison) in poisons.iter().enumerate() {
        let user = format!("poisoned-{i}");
        let key = format!("tollgate:{{log|reset={user}}}:sl:hour");
        redis.poison(&key, poison);
        for n in 0..6 {
            let both = request(
                "log",
                &[&[("reset", &user)], &[("race", &format!("other-{i}"))]],
            );
            let answer = ask(&mut client, both).await;
            let expected = if n < 5 { Code::Ok } else { Code::OverLimit };
            assert_eq!(
                answer.overall_code, expected as i32,
                "{poison}, request {n}"
            );
        }
        let ttl: i64 = redis.cli(&["PTTL", &key]).trim().parse().expect("a number");
        assert!(
            ttl > 3_000_000,
            "{poison}: rewritten with an hour's expiry: {ttl}"
        );
    }
}
