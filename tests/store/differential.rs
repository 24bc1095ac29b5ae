//! The memory store and the Redis scripts decide alike: random sequences of
//! requests (descriptors, hits from 0 to u64::MAX, limits from 0 to
//! u32::MAX over every unit, all four algorithms, unit multipliers,
//! calendar windows, budgets, several limits per descriptor, quota mode,
//! limits sent in the request, clock jumps from a microsecond to a year) go through two
//! limiters on one manual clock, one on the memory store and one on a real
//! Redis (standalone, and a 3-master Cluster where one request spans
//! slots), and every answer must match: codes, remaining counts and reset
//! times. Bursts of concurrent requests, which Redis decides in shared script
//! calls, must match the same requests decided one by one.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer};
use proptest::prelude::*;
use tollgate::clock::{Clock, ManualClock};
use tollgate::limiter::{Descriptor, LimitOverride, Limiter, LimiterOptions, Request};
use tollgate::rules::{RuleSet, Unit};
use tollgate::store::redis::{RedisOptions, RedisStore, RedisTarget};
use tollgate::store::{MemoryStore, MemoryStoreOptions, Store};

const RULES: &str = "domain: d
descriptors:
  - key: fw1
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: fixed_window}
  - key: fw2
    rate_limit: {unit: day, requests_per_unit: 1000000, algorithm: fixed_window}
  - key: sw1
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: sliding_window}
  - key: sw2
    rate_limit: {unit: minute, requests_per_unit: 7, algorithm: sliding_window}
  - key: sw3
    rate_limit: {unit: year, requests_per_unit: 4000000000, algorithm: sliding_window}
  - key: sw4
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window}
  - key: tb1
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: token_bucket, burst: 5}
  - key: tb2
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket, burst: 1000}
  - key: tb3
    rate_limit: {unit: year, requests_per_unit: 4000000000, algorithm: token_bucket, burst: 4000000000}
  - key: tb4
    rate_limit: {unit: minute, requests_per_unit: 7, algorithm: token_bucket, burst: 1}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0, algorithm: fixed_window}
  - key: fw5
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 7, algorithm: fixed_window}
  - key: sw7
    rate_limit: {unit: second, unit_multiplier: 7, requests_per_unit: 5, algorithm: sliding_window}
  - key: tb5
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3, algorithm: token_bucket}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 9, calendar: true, time_zone: Europe/Berlin}
  - key: days
    rate_limit: {unit: day, unit_multiplier: 2, requests_per_unit: 4, calendar: true, time_zone: America/New_York}
  - key: bfw
    rate_limit: {unit: second, requests_per_unit: 5, budget: true, algorithm: fixed_window}
  - key: bsw
    rate_limit: {unit: minute, requests_per_unit: 50, budget: true, algorithm: sliding_window}
  - key: btb
    rate_limit: {unit: second, requests_per_unit: 4, budget: true, algorithm: token_bucket, burst: 8}
  - key: multi
    rate_limits:
      - {unit: second, requests_per_unit: 2, algorithm: token_bucket}
      - {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
      - {unit: hour, requests_per_unit: 9, algorithm: sliding_window, budget: true}
  - key: sl1
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: sliding_log}
  - key: sl2
    rate_limit: {unit: minute, requests_per_unit: 7, algorithm: sliding_log}
  - key: sl3
    rate_limit: {unit: second, unit_multiplier: 7, requests_per_unit: 1000, algorithm: sliding_log}
  - key: bsl
    rate_limit: {unit: minute, requests_per_unit: 5, budget: true, algorithm: sliding_log}
  - key: msl
    rate_limits:
      - {unit: second, requests_per_unit: 2, algorithm: sliding_log}
      - {unit: minute, requests_per_unit: 5, algorithm: fixed_window}
  - key: q1
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: fixed_window}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
";

const KEYS: [&str; 27] = [
    "fw1", "fw2", "sw1", "sw2", "sw3", "sw4", "tb1", "tb2", "tb3", "tb4", "zero", "fw5", "sw7",
    "tb5", "month", "days", "bfw", "bsw", "btb", "multi", "sl1", "sl2", "sl3", "bsl", "msl", "q1",
    "q2",
];

/// A real Redis (standalone or a 3-master Cluster) and one runtime, shared
/// by every case (the store keeps a connection per thread, on the runtime
/// that made it).
struct Shared {
    urls: Vec<String>,
    cluster: bool,
    runtime: tokio::runtime::Runtime,
    _servers: (Option<RedisServer>, Option<RedisCluster>),
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

static STANDALONE: LazyLock<Mutex<Shared>> = LazyLock::new(|| {
    let redis = RedisServer::start();
    Mutex::new(Shared {
        urls: vec![redis.url()],
        cluster: false,
        runtime: runtime(),
        _servers: (Some(redis), None),
    })
});

static CLUSTER: LazyLock<Mutex<Shared>> = LazyLock::new(|| {
    let cluster = RedisCluster::start();
    Mutex::new(Shared {
        urls: cluster.nodes.iter().map(|n| n.url()).collect(),
        cluster: true,
        runtime: runtime(),
        _servers: (None, Some(cluster)),
    })
});

/// One descriptor: rule key index, value index, hits, and a limit sent in
/// the request (requests per unit, unit index).
type Asked = (usize, u8, u64, Option<(u32, usize)>);

#[derive(Debug, Clone)]
struct Op {
    /// Microseconds to move the clock first.
    gap_us: u64,
    descriptors: Vec<Asked>,
}

fn op() -> impl Strategy<Value = Op> {
    let gap = prop_oneof![
        Just(0u64),
        Just(1),
        Just(999),
        Just(1_000),
        0u64..2_000_000,
        Just(59_999_999),
        Just(3_600_000_000),
        Just(86_400_000_000),
        Just(31_536_000_000_000),
    ];
    let hits = prop_oneof![
        3 => 0u64..4,
        1 => Just(7u64),
        1 => Just(1_000u64),
        1 => Just(1u64 << 32),
        1 => Just(1u64 << 53),
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ];
    let limit_override = prop_oneof![
        4 => Just(None),
        1 => (
            prop_oneof![Just(0u32), Just(1), Just(5), Just(1000), Just(u32::MAX), any::<u32>()],
            0usize..7
        )
            .prop_map(Some),
    ];
    let descriptor = (0..KEYS.len(), 0u8..2, hits, limit_override);
    (gap, prop::collection::vec(descriptor, 1..4)).prop_map(|(gap_us, descriptors)| Op {
        gap_us,
        descriptors,
    })
}

fn limiter(store: Store, clock: &ManualClock) -> Limiter {
    let rules = RuleSet::from_yaml(RULES).expect("rules");
    let options = LimiterOptions {
        // A Redis error is a failed test, not a failure mode.
        unavailable_on_store_error: true,
        ..LimiterOptions::default()
    };
    Limiter::new(rules, store, Arc::new(clock.clone()), options)
}

fn request_of(descriptors: &[Asked]) -> Request<'static> {
    const VALUES: [&str; 2] = ["a", "b|x=y"];
    Request {
        domain: "d",
        descriptors: descriptors
            .iter()
            .map(|&(key, value, hits, limit)| Descriptor {
                entries: [(KEYS[key], VALUES[usize::from(value)])]
                    .into_iter()
                    .collect(),
                hits_addend: Some(hits),
                limit_override: limit.map(|(rpu, unit)| LimitOverride {
                    requests_per_unit: rpu,
                    unit: Unit::ALL[unit],
                }),
            })
            .collect(),
        hits_addend: 0,
    }
}

/// Empties Redis and makes a memory limiter and a Redis one on `clock`.
fn limiters(shared: &Shared, clock: &ManualClock) -> (Limiter, Limiter) {
    for url in &shared.urls {
        let mut admin = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .expect("admin connection");
        // On a Cluster replica FLUSHALL is refused; masters hold the keys.
        let _ = redis::cmd("FLUSHALL").query::<()>(&mut admin);
    }
    let memory = limiter(
        Store::Memory(MemoryStore::new(MemoryStoreOptions::default())),
        clock,
    );
    let target = match shared.cluster {
        true => RedisTarget::Cluster(shared.urls.clone()),
        false => RedisTarget::Standalone(shared.urls[0].clone()),
    };
    let mut options = RedisOptions::new(target);
    options.timeout = Duration::from_secs(2);
    let redis = limiter(
        Store::Redis(RedisStore::new(options).expect("store")),
        clock,
    );
    (memory, redis)
}

/// Script calls Redis has served (`INFO commandstats`), over every node.
fn script_calls(shared: &Shared) -> u64 {
    shared
        .urls
        .iter()
        .map(|url| {
            let mut admin = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .expect("admin connection");
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut admin)
                .expect("INFO");
            crate::common::redis::script_calls_in(&info)
        })
        .sum()
}

/// Bursts of concurrent requests on one connection: they share script calls
/// (the first goes alone, the rest wait for it and go together), and every
/// answer is the one the memory store gives the same requests one by one,
/// in the order they queued.
fn run_bursts(
    shared: &Mutex<Shared>,
    bursts: &[(u64, Vec<Vec<Asked>>)],
) -> Result<(), TestCaseError> {
    let shared = shared.lock().unwrap_or_else(|e| e.into_inner());
    let clock = ManualClock::new(crate::common::next_whole_hour());
    let (memory, redis) = limiters(&shared, &clock);
    // Load the script first (a fresh Redis answers NOSCRIPT once, and the
    // retry is a second call), on a key no burst uses.
    let warm_up = Request {
        domain: "d",
        descriptors: [Descriptor {
            entries: [("fw2", "warm-up")].into_iter().collect(),
            ..Descriptor::default()
        }]
        .into_iter()
        .collect(),
        hits_addend: 0,
    };
    shared
        .runtime
        .block_on(redis.should_rate_limit(&warm_up))
        .expect("Redis decides");
    for (step, (gap_us, burst)) in bursts.iter().enumerate() {
        clock.set(clock.now() + gap_us * 1_000);
        let requests: Vec<Request<'static>> = burst.iter().map(|d| request_of(d)).collect();
        let before = script_calls(&shared);
        let together = shared.runtime.block_on(futures_util::future::join_all(
            requests.iter().map(|r| redis.should_rate_limit(r)),
        ));
        let calls = script_calls(&shared) - before;
        for (i, (request, r)) in requests.iter().zip(together).enumerate() {
            let m = shared
                .runtime
                .block_on(memory.should_rate_limit(request))
                .expect("memory decides");
            let r = r.expect("Redis decides");
            prop_assert_eq!(&m, &r, "burst {} request {}: {:?}", step, i, burst[i]);
        }
        if !shared.cluster && requests.len() > 2 {
            // Standalone: one slot, so one call alone and one for the rest
            // (requests without a limit make no call at all).
            prop_assert!(
                calls <= 2,
                "burst {}: {} requests took {} calls",
                step,
                requests.len(),
                calls
            );
        }
    }
    Ok(())
}

fn run(shared: &Mutex<Shared>, ops: &[Op]) -> Result<(), TestCaseError> {
    let shared = shared.lock().unwrap_or_else(|e| e.into_inner());
    let clock = ManualClock::new(crate::common::next_whole_hour());
    let (memory, redis) = limiters(&shared, &clock);
    for (step, op) in ops.iter().enumerate() {
        clock.set(clock.now() + op.gap_us * 1_000);
        let request = request_of(&op.descriptors);
        let (m, r) = shared.runtime.block_on(async {
            (
                memory.should_rate_limit(&request).await,
                redis.should_rate_limit(&request).await,
            )
        });
        let (m, r) = (m.expect("memory decides"), r.expect("Redis decides"));
        prop_assert_eq!(&m, &r, "step {}: {:?}", step, op);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn memory_and_redis_decide_alike(ops in prop::collection::vec(op(), 1..60)) {
        run(&STANDALONE, &ops)?;
    }
}

/// Bursts of up to 40 requests; on a Cluster, of one descriptor each: a
/// request across slots is refunded after the fact, and requests running
/// beside it may see its hits until then (README, "All or nothing across
/// slots"), with or without shared calls.
fn bursts(one_slot: bool) -> impl Strategy<Value = Vec<(u64, Vec<Vec<Asked>>)>> {
    let request = op().prop_map(move |mut o| {
        if one_slot {
            o.descriptors.truncate(1);
        }
        o.descriptors
    });
    let burst = (
        prop_oneof![Just(0u64), 0u64..2_000_000, Just(60_000_000)],
        prop::collection::vec(request, 1..40),
    );
    prop::collection::vec(burst, 1..6)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn a_coalesced_call_decides_as_one_call_per_request(bursts in bursts(false)) {
        run_bursts(&STANDALONE, &bursts)?;
    }

    #[test]
    fn coalesced_calls_on_a_cluster_decide_as_one_call_per_request(bursts in bursts(true)) {
        run_bursts(&CLUSTER, &bursts)?;
    }
}

proptest! {
    // Across slots (requests of several descriptors span masters), with the
    // refunds that keep a refused request from spending anything.
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn memory_and_redis_cluster_decide_alike(ops in prop::collection::vec(op(), 1..40)) {
        run(&CLUSTER, &ops)?;
    }
}
