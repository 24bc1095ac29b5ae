//! Memory-store decisions per second: one hot key, and 100,000 distinct keys;
//! both for the store alone and through the limiter (rule matching, key
//! building, the store and the response, everything but gRPC); and what a
//! descriptor with several limits (`rate_limits`) or a calendar limit costs
//! against one ordinary limit.
//!
//! Run: `cargo bench --bench memory_store`

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::hint::black_box;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgate::algorithm::{Algorithm, Quota};
use tollgate::clock::{NANOS_PER_SEC, SystemClock};
use tollgate::limiter::{Descriptor, Limiter, Request};
use tollgate::rules::{RuleSet, Unit};
use tollgate::store::{Check, CounterKey, MemoryStore, MemoryStoreOptions};

const DISTINCT: usize = 100_000;

/// The memory store never waits, so one poll completes the future.
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("the memory store never waits"),
    }
}

fn key(i: usize) -> CounterKey {
    let mut k = CounterKey::new("api", Algorithm::SlidingWindow, Unit::Minute);
    k.entry("remote_address", &format!("10.0.{}.{}", i / 256, i % 256));
    k
}

fn store(c: &mut Criterion) {
    let quota = Quota::new(u32::MAX, 60 * NANOS_PER_SEC, 1);
    let store = MemoryStore::new(MemoryStoreOptions::default());
    let now = 1_800_000_000 * NANOS_PER_SEC;
    let mut group = c.benchmark_group("memory_store");
    group.throughput(Throughput::Elements(1));
    let hot = key(0);
    group.bench_function("hot_key", |b| {
        b.iter(|| {
            let mut checks = [Check::new(
                hot.clone(),
                Algorithm::SlidingWindow,
                quota,
                1,
                true,
            )];
            store.decide(black_box(&mut checks), now).expect("decides");
            black_box(checks[0].outcome)
        })
    });
    let keys: Vec<CounterKey> = (0..DISTINCT).map(key).collect();
    let mut i = 0;
    group.bench_function("100k_keys", |b| {
        b.iter(|| {
            i = (i + 1) % DISTINCT;
            let mut checks = [Check::new(
                keys[i].clone(),
                Algorithm::SlidingWindow,
                quota,
                1,
                true,
            )];
            store.decide(black_box(&mut checks), now).expect("decides");
            black_box(checks[0].outcome)
        })
    });
    group.finish();
}

const ONE: &str = "domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 4000000000}
";

const SEVERAL: &str = "domain: api
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 4000000000, algorithm: token_bucket}
      - {unit: minute, requests_per_unit: 4000000000}
      - {unit: hour, requests_per_unit: 4000000000, algorithm: fixed_window}
";

const CALENDAR: &str = "domain: api
descriptors:
  - key: remote_address
    rate_limit: {unit: month, requests_per_unit: 4000000000, calendar: true, time_zone: Europe/Berlin}
";

/// A limiter on the memory store over `rules`.
fn memory_limiter(rules: &str) -> Limiter {
    Limiter::in_memory(
        RuleSet::from_yaml(rules).expect("rules"),
        Arc::new(SystemClock),
    )
}

fn limiter(c: &mut Criterion) {
    let limiter = memory_limiter(ONE);
    let addresses: Vec<String> = (0..DISTINCT)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect();
    let mut group = c.benchmark_group("limiter");
    group.throughput(Throughput::Elements(1));
    group.bench_function("hot_key", |b| {
        b.iter(|| black_box(ready(limiter.should_rate_limit(&request(&addresses[0])))))
    });
    let mut i = 0;
    group.bench_function("100k_keys", |b| {
        b.iter(|| {
            i = (i + 1) % DISTINCT;
            black_box(ready(limiter.should_rate_limit(&request(&addresses[i]))))
        })
    });
    group.finish();
}

fn request(addr: &str) -> Request<'_> {
    Request {
        domain: "api",
        descriptors: [Descriptor {
            entries: [("remote_address", addr)].into_iter().collect(),
            ..Descriptor::default()
        }]
        .into_iter()
        .collect(),
        hits_addend: 0,
    }
}

/// One limit against three on the same descriptor, and a calendar month,
/// over 100,000 keys through the limiter.
fn several_limits(c: &mut Criterion) {
    let addresses: Vec<String> = (0..DISTINCT)
        .map(|i| format!("10.0.{}.{}", i / 256, i % 256))
        .collect();
    let mut group = c.benchmark_group("limits_per_descriptor");
    group.throughput(Throughput::Elements(1));
    for (name, rules) in [
        ("one", ONE),
        ("three", SEVERAL),
        ("calendar_month", CALENDAR),
    ] {
        let limiter = memory_limiter(rules);
        let mut i = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % DISTINCT;
                black_box(ready(limiter.should_rate_limit(&request(&addresses[i]))))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, store, limiter, several_limits);
criterion_main!(benches);
