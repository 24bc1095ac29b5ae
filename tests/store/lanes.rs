//! Priority lanes (`lanes:` on a descriptor, issue 42): one counter, each
//! lane admitted only while the counter is below its share of the limit.
//! The same answers on the memory store, a real Redis and a real Redis
//! Cluster: exact for requests in turn, within the shares for many clients
//! racing. Periods of ten years: no window edge passes while a test counts.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{Served, ask, request};

const RULES: &str = "domain: lanes
descriptors:
  - key: org
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 50, algorithm: fixed_window}
    lanes: {key: priority, shares: {background: 60, batch: 20}}
  - key: sliding
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 50, algorithm: sliding_window}
    lanes: {key: priority, shares: {background: 60, batch: 20}}
  - key: bucket
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 50, algorithm: token_bucket}
    lanes: {key: priority, shares: {background: 60, batch: 20}}
";

/// How many of `n` requests of `key: value` in `lane` (none: no lane
/// entry) are admitted, one after another.
async fn admitted(
    server: &Served,
    (key, value): (&str, &str),
    lane: Option<&str>,
    n: usize,
) -> usize {
    let mut client = server.client().await;
    let mut admitted = 0;
    for _ in 0..n {
        let entries: Vec<(&str, &str)> = match lane {
            Some(lane) => vec![(key, value), ("priority", lane)],
            None => vec![(key, value)],
        };
        let answer = ask(&mut client, request("lanes", &[&entries])).await;
        admitted += usize::from(answer.overall_code == Code::Ok as i32);
    }
    admitted
}

/// Every algorithm: the batch lane (20 %) takes 10 of 50, the background
/// lane (60 %) 20 more, a lane not listed (15) and a request without a lane
/// entry (the last 5) count at 100 % in the same counter; then nothing
/// passes.
async fn lanes_share_one_counter(server: &Served) {
    for key in ["org", "sliding", "bucket"] {
        let id = (key, "acme");
        assert_eq!(
            admitted(server, id, Some("batch"), 15).await,
            10,
            "{key}: batch"
        );
        assert_eq!(
            admitted(server, id, Some("background"), 30).await,
            20,
            "{key}: background"
        );
        assert_eq!(
            admitted(server, id, Some("batch"), 5).await,
            0,
            "{key}: batch is full"
        );
        assert_eq!(
            admitted(server, id, Some("live"), 15).await,
            15,
            "{key}: an unlisted lane"
        );
        assert_eq!(
            admitted(server, id, None, 15).await,
            5,
            "{key}: no lane entry"
        );
        assert_eq!(
            admitted(server, id, Some("live"), 3).await,
            0,
            "{key}: the limit"
        );
        // Another client has its own counter.
        assert_eq!(
            admitted(server, (key, "other"), Some("background"), 40).await,
            30
        );
    }
}

/// 16 clients racing, half in the background lane: together they take the
/// whole limit, and the background lane never more than its share.
async fn racing_lanes_stay_within_their_shares(server: &Served) {
    for key in ["org", "sliding", "bucket"] {
        let mut tasks = Vec::new();
        for t in 0..16 {
            let mut client = server.client().await;
            let lane = if t % 2 == 0 { "background" } else { "live" };
            tasks.push(tokio::spawn(async move {
                let mut ok = 0;
                for _ in 0..10 {
                    let entries = [(key, "race"), ("priority", lane)];
                    let answer = ask(&mut client, request("lanes", &[&entries])).await;
                    ok += usize::from(answer.overall_code == Code::Ok as i32);
                }
                (lane, ok)
            }));
        }
        let (mut background, mut total) = (0, 0);
        for task in tasks {
            let (lane, ok) = task.await.expect("client");
            total += ok;
            if lane == "background" {
                background += ok;
            }
        }
        assert_eq!(total, 50, "{key}: the limit, exactly");
        assert!(
            background <= 30,
            "{key}: background took {background} of its 30"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lanes_on_the_memory_store() {
    let server = Served::start(RULES, &[]);
    lanes_share_one_counter(&server).await;
    racing_lanes_stay_within_their_shares(&server).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lanes_on_redis_and_a_cluster() {
    let redis = RedisServer::start();
    let server = Served::on_redis(
        RULES,
        &redis.url(),
        &["--redis-timeout", "2s", "--over-limit-cache", "on"],
    );
    lanes_share_one_counter(&server).await;
    racing_lanes_stay_within_their_shares(&server).await;

    let cluster = RedisCluster::start();
    let server = Served::on_cluster(RULES, &cluster.urls(), &["--redis-timeout", "2s"]);
    lanes_share_one_counter(&server).await;
    racing_lanes_stay_within_their_shares(&server).await;
}
