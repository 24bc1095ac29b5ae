//! The memory store and the Redis scripts decide alike: random sequences of
//! requests (descriptors, hits from 0 to u64::MAX, limits from 0 to
//! u32::MAX over every unit, all three algorithms, unit multipliers,
//! calendar windows, budgets, several limits per descriptor, quota mode,
//! limits sent in the request, clock jumps from a microsecond to a year) go through two
//! limiters on one manual clock, one on the memory store and one on a real
//! Redis (standalone, and a 3-master Cluster where one request spans
//! slots), and every answer must match: codes, remaining counts and reset
//! times.

mod common;

use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use common::redis::{RedisCluster, RedisServer};
use proptest::prelude::*;
use tollgate::clock::{Clock, ManualClock};
use tollgate::limiter::{Descriptor, LimitOverride, Limiter, LimiterOptions, Request};
use tollgate::rules::{LoadOptions, Unit, load_sources};
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
  - key: q1
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: fixed_window}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window}
";

const KEYS: [&str; 22] = [
    "fw1", "fw2", "sw1", "sw2", "sw3", "sw4", "tb1", "tb2", "tb3", "tb4", "zero", "fw5", "sw7",
    "tb5", "month", "days", "bfw", "bsw", "btb", "multi", "q1", "q2",
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
    let rules = load_sources(
        &[(PathBuf::from("d.yaml"), RULES.into())],
        &LoadOptions::default(),
    )
    .expect("rules");
    let options = LimiterOptions {
        // A Redis error is a failed test, not a failure mode.
        unavailable_on_store_error: true,
        ..LimiterOptions::default()
    };
    Limiter::new(rules, store, Arc::new(clock.clone()), options)
}

fn run(shared: &Mutex<Shared>, ops: &[Op]) -> Result<(), TestCaseError> {
    let shared = shared.lock().unwrap_or_else(|e| e.into_inner());
    for url in &shared.urls {
        let mut admin = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .expect("admin connection");
        // On a Cluster replica FLUSHALL is refused; masters hold the keys.
        let _ = redis::cmd("FLUSHALL").query::<()>(&mut admin);
    }
    let clock = ManualClock::new(common::next_whole_hour());
    let memory = limiter(
        Store::Memory(MemoryStore::new(MemoryStoreOptions::default())),
        &clock,
    );
    let target = match shared.cluster {
        true => RedisTarget::Cluster(shared.urls.clone()),
        false => RedisTarget::Standalone(shared.urls[0].clone()),
    };
    let mut options = RedisOptions::new(target);
    options.timeout = Duration::from_secs(2);
    let redis = limiter(
        Store::Redis(RedisStore::new(options).expect("store")),
        &clock,
    );
    let values = ["a", "b|x=y"];
    for (step, op) in ops.iter().enumerate() {
        clock.set(clock.now() + op.gap_us * 1_000);
        let request = Request {
            domain: "d",
            descriptors: op
                .descriptors
                .iter()
                .map(|&(key, value, hits, limit)| Descriptor {
                    entries: [(KEYS[key], values[usize::from(value)])]
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
        };
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

proptest! {
    // Across slots (requests of several descriptors span masters), with the
    // refunds that keep a refused request from spending anything.
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn memory_and_redis_cluster_decide_alike(ops in prop::collection::vec(op(), 1..40)) {
        run(&CLUSTER, &ops)?;
    }
}
