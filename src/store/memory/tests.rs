use super::*;
use crate::algorithm::{Algorithm, Quota};
use crate::period::Unit;

const SEC: Nanos = NANOS_PER_SEC;

fn key(name: &str) -> CounterKey {
    let mut k = CounterKey::new("test", Algorithm::FixedWindow, Unit::Minute);
    k.entry("user", name);
    k
}

fn check(name: &str, limit: u32) -> Check {
    Check::new(
        key(name),
        Algorithm::FixedWindow,
        Quota::new(limit, 60 * SEC, limit),
        1,
        true,
    )
}

fn admit(store: &MemoryStore, name: &str, limit: u32, now: Nanos) -> bool {
    let mut checks = [check(name, limit)];
    store
        .decide(&mut checks, now)
        .expect("memory store decides");
    checks[0].outcome.expect("decided").allowed
}

/// Every key collides on the 64-bit hash; the 32-bit check still tells them apart.
fn colliding(_seed: u64, bytes: &[u8]) -> u128 {
    u128::from(xxhash_rust::xxh3::xxh3_64(bytes) as u32)
}

#[test]
fn colliding_keys_keep_separate_counters() {
    let store = MemoryStore::with_hasher(MemoryStoreOptions::default(), 0, colliding);
    for _ in 0..3 {
        assert!(admit(&store, "alice", 3, 0));
    }
    assert!(!admit(&store, "alice", 3, 0));
    // bob's hash collides with alice's: he still has his own budget.
    for _ in 0..3 {
        assert!(admit(&store, "bob", 3, 0));
    }
    assert!(!admit(&store, "bob", 3, 0));
    assert!(!admit(&store, "alice", 3, 0));
    assert_eq!(store.len(), 2);
}

#[test]
fn collided_key_survives_the_expiry_of_the_first() {
    let store = MemoryStore::with_hasher(MemoryStoreOptions::default(), 0, colliding);
    assert!(admit(&store, "alice", 1, 0));
    // bob collides into the overflow map, in the next minute.
    assert!(admit(&store, "bob", 1, 61 * SEC));
    // alice's entry expires and is swept; bob's state must still be found.
    assert_eq!(
        store.sweep(100 * SEC),
        1,
        "alice's window is over, bob's is not"
    );
    assert!(!admit(&store, "bob", 1, 61 * SEC));
}

#[test]
fn state_is_dropped_once_it_cannot_matter() {
    let store = MemoryStore::new(MemoryStoreOptions::default());
    for i in 0..1000 {
        assert!(admit(&store, &format!("u{i}"), 5, 10 * SEC));
    }
    assert_eq!(store.len(), 1000);
    assert_eq!(store.sweep(59 * SEC), 0, "the window is still open");
    assert_eq!(store.sweep(60 * SEC), 1000);
    assert!(store.is_empty());
}

#[test]
fn the_key_cap_refuses_new_keys_and_keeps_existing_ones() {
    let store = MemoryStore::new(MemoryStoreOptions {
        max_keys: 4,
        shards: 1,
    });
    for i in 0..4 {
        assert!(admit(&store, &format!("u{i}"), 5, 0));
    }
    let mut fifth = [check("u4", 5)];
    assert_eq!(
        store.decide(&mut fifth, 0),
        Err(StoreError::Full { max_keys: 4 })
    );
    assert!(admit(&store, "u0", 5, 0), "existing keys keep working");
    // Once the old windows expire, their room is reused.
    assert!(admit(&store, "u4", 5, 60 * SEC));
}

#[test]
fn a_denied_request_spends_nothing_on_any_counter() {
    let store = MemoryStore::new(MemoryStoreOptions::default());
    assert!(admit(&store, "tight", 1, 0));
    let mut both = [check("loose", 10), check("tight", 1)];
    store.decide(&mut both, 0).expect("decides");
    let loose = both[0].outcome.expect("decided");
    assert!(loose.allowed && !both[1].outcome.expect("decided").allowed);
    assert_eq!(loose.remaining, 10, "reports the unspent budget");
    for _ in 0..10 {
        assert!(admit(&store, "loose", 10, 0));
    }
}

#[test]
fn concurrent_requests_admit_exactly_the_limit() {
    let store = std::sync::Arc::new(MemoryStore::new(MemoryStoreOptions::default()));
    let admitted = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..50 {
                    if admit(&store, "hot", 100, 0) {
                        admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(admitted.into_inner(), 100);
}

#[test]
fn a_request_the_full_store_cannot_hold_spends_nothing() {
    // One shard of three keys; two are taken.
    let store = MemoryStore::new(MemoryStoreOptions {
        max_keys: 3,
        shards: 1,
    });
    assert!(admit(&store, "a", 10, 0));
    assert!(admit(&store, "b", 10, 0));
    // An existing key and two new ones: room for one new key only.
    let mut checks = [check("a", 10), check("c", 10), check("d", 10)];
    assert_eq!(
        store.decide(&mut checks, 0),
        Err(StoreError::Full { max_keys: 3 })
    );
    assert_eq!(store.len(), 2, "no new key was written");
    // `a` was not charged for the refused request: 10 - 1 left before, 9 now.
    let mut probe = [Check::new(
        key("a"),
        Algorithm::FixedWindow,
        check("a", 10).quota,
        0,
        true,
    )];
    store.decide(&mut probe, 0).expect("decides");
    assert_eq!(probe[0].outcome.expect("decided").remaining, 9);
    // The same key twice needs room for one key, which there is.
    let mut twice = [check("c", 10), check("c", 10)];
    store.decide(&mut twice, 0).expect("one new key fits");
    assert_eq!(store.len(), 3);
}
