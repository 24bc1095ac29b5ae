//! Resident memory per active key in the memory store, measured as this
//! process's RSS growth (its own test binary, so nothing else allocates).

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use tollgate::algorithm::{Algorithm, Quota};
use tollgate::clock::NANOS_PER_SEC;
use tollgate::rules::Unit;
use tollgate::store::{Check, CounterKey, MemoryStore, MemoryStoreOptions};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("rss field");
    pages * 4096
}

#[test]
fn one_million_keys_cost_at_most_100_bytes_each() {
    const KEYS: u64 = 1_000_000;
    let quota = Quota::new(100, 3600 * NANOS_PER_SEC, 100);
    let before = rss_bytes();
    let store = MemoryStore::new(MemoryStoreOptions::default());
    let now = 1_800_000_000 * NANOS_PER_SEC;
    let mut ip = String::new();
    for i in 0..KEYS {
        use std::fmt::Write;
        ip.clear();
        let _ = write!(ip, "10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
        let mut key = CounterKey::new("api", Algorithm::SlidingWindow, Unit::Hour);
        key.entry("remote_address", &ip);
        let mut checks = [Check::new(key, Algorithm::SlidingWindow, quota, 1, true)];
        store
            .decide(&mut checks, now)
            .expect("room for a million keys");
    }
    assert_eq!(store.len() as u64, KEYS);
    let per_key = (rss_bytes() - before) as f64 / KEYS as f64;
    println!("memory store: {per_key:.1} bytes of RSS per active key ({KEYS} keys)");
    assert!(per_key <= 100.0, "{per_key:.1} bytes per key");
    drop(store);
}
