//! In-flight caps and reservations through the limiter and the memory
//! store: which calls hold, free and settle which IDs, and every way a
//! call can name them wrong.

use std::time::Duration;

use super::*;
use crate::clock::{ManualClock, NANOS_PER_SEC};
use crate::rules::RuleSet;
use crate::store::MemoryStoreOptions;

const RULES: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
    in_flight: {limit: 2, max_hold_seconds: 60}
  - key: key
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window, budget: true, reserve: true}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
";

fn limiter() -> (Limiter, ManualClock) {
    let rules = RuleSet::from_yaml(RULES).expect("rules load");
    let clock = ManualClock::new(1_000 * 3600 * NANOS_PER_SEC + 5 * NANOS_PER_SEC);
    let limiter = Limiter::new(
        rules,
        Store::memory(MemoryStoreOptions::default()),
        Arc::new(clock.clone()),
        LimiterOptions::default(),
    );
    (limiter, clock)
}

fn call<'a>(entries: &[(&'a str, &'a str)], hits: Option<u64>) -> Request<'a> {
    Request {
        domain: "api",
        descriptors: vec![Descriptor {
            entries: entries.iter().copied().collect(),
            hits_addend: hits,
            ..Descriptor::default()
        }]
        .into(),
        hits_addend: 0,
    }
}

async fn ok(l: &Limiter, r: &Request<'_>) -> bool {
    !l.should_rate_limit(r).await.expect("valid").over_limit
}

#[tokio::test]
async fn an_in_flight_cap_frees_the_slot_of_the_id_that_releases_it() {
    let (l, clock) = limiter();
    let take = |id| call(&[("user", "ann"), ("request_id", id)], None);
    let release = |id| call(&[("user", "ann"), ("release", id)], None);
    assert!(ok(&l, &take("r1")).await && ok(&l, &take("r2")).await);
    assert!(
        !ok(&l, &take("r3")).await,
        "two in progress: the third waits"
    );
    // The refused request's stream-end call, an unknown ID, a repeat: nothing.
    assert!(ok(&l, &release("r3")).await && ok(&l, &release("nobody")).await);
    assert!(!ok(&l, &take("r4")).await);
    assert!(!ok(&l, &take("r1")).await, "a held ID takes no second slot");
    assert!(ok(&l, &release("r1")).await);
    assert!(ok(&l, &release("r1")).await);
    assert!(ok(&l, &take("r4")).await, "r1's slot");
    assert!(!ok(&l, &take("r5")).await, "only one was freed");
    // Another user has slots of their own; the node's own limit is apart.
    assert!(ok(&l, &call(&[("user", "bob"), ("request_id", "r1")], None)).await);
    assert!(ok(&l, &call(&[("user", "ann")], None)).await);
    // Never released: free again after max_hold_seconds.
    clock.advance(Duration::from_secs(61));
    assert!(ok(&l, &take("r5")).await && ok(&l, &take("r6")).await);
    assert!(!ok(&l, &take("r7")).await);
}

#[tokio::test]
async fn reservations_bound_the_overdraw_and_settle_to_the_real_cost() {
    let (l, _) = limiter();
    let reserve = |id, n| call(&[("key", "k"), ("request_id", id)], Some(n));
    let settle = |id, n| call(&[("key", "k"), ("settle", id)], Some(n));
    // Ten concurrent requests of up to 30 tokens: three fit in 100.
    let mut admitted = Vec::new();
    for id in ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"] {
        if ok(&l, &reserve(id, 30)).await {
            admitted.push(id);
        }
    }
    assert_eq!(admitted, ["a", "b", "c"]);
    // The refused ones' stream ends refund nothing (and charge their 0).
    for id in ["d", "e", "f", "g", "h", "i", "j"] {
        assert!(ok(&l, &settle(id, 0)).await);
    }
    // Real costs 10, 20 and 45: 75 spent, 25 left.
    for (id, cost) in [("a", 10), ("b", 20), ("c", 45)] {
        assert!(ok(&l, &settle(id, cost)).await);
    }
    let left = l
        .should_rate_limit(&call(&[("key", "k")], Some(0)))
        .await
        .expect("valid");
    assert_eq!(left.statuses[0].remaining, 25);
    // A second settlement of one ID charges again (no reservation left).
    assert!(ok(&l, &settle("a", 5)).await);
    assert!(ok(&l, &reserve("k", 20)).await);
    assert!(!ok(&l, &reserve("l", 1)).await, "100 spent");
}

#[tokio::test]
async fn a_release_is_applied_even_when_the_request_is_refused() {
    let (l, _) = limiter();
    for i in 0..5 {
        assert!(ok(&l, &call(&[("plain", "p")], None)).await, "{i}");
    }
    let take = call(&[("user", "ann"), ("request_id", "r1")], None);
    assert!(ok(&l, &take).await);
    // Envoy's stream-end call of r1 also carries an over-limit descriptor.
    let mut both = call(&[("user", "ann"), ("release", "r1")], None);
    both.descriptors.push(Descriptor {
        entries: [("plain", "p")].into_iter().collect(),
        ..Descriptor::default()
    });
    let d = l.should_rate_limit(&both).await.expect("valid");
    assert!(d.over_limit);
    assert!(!d.statuses[0].over_limit);
    // r1's slot is free: two more fit.
    let again = |id| call(&[("user", "ann"), ("request_id", id)], None);
    assert!(ok(&l, &again("r2")).await && ok(&l, &again("r3")).await);
}

#[tokio::test]
async fn request_ids_named_wrong_never_turn_the_other_limits_off() {
    let (l, _) = limiter();
    let decide = |entries: &'static [(&'static str, &'static str)]| {
        let l = &l;
        async move {
            // Beside a descriptor over its limit: the request stays refused.
            let mut r = call(entries, Some(1));
            r.descriptors.push(Descriptor {
                entries: [("plain", "full")].into_iter().collect(),
                ..Descriptor::default()
            });
            l.should_rate_limit(&r)
                .await
                .expect("decided, never an error")
        }
    };
    for _ in 0..5 {
        assert!(ok(&l, &call(&[("plain", "full")], None)).await);
    }
    // A node without the rules an ID entry concerns: unmatched, no limit.
    for entries in [
        &[("plain", "p"), ("request_id", "x")][..],
        &[("key", "k"), ("release", "x")],
        &[("user", "u"), ("settle", "x")],
    ] {
        let d = decide(entries).await;
        assert!(d.over_limit, "{entries:?}");
        assert!(
            d.statuses[0].limit.is_none() && !d.statuses[0].over_limit,
            "{entries:?}"
        );
    }
    // An ID no store may hold: a take or a reservation is refused, a
    // release or a settlement changes nothing.
    let long: &'static str = Box::leak("x".repeat(257).into_boxed_str());
    let too_long: &'static [(&str, &str)] =
        Box::leak(Box::new([("user", "u"), ("request_id", long)]));
    for entries in [
        &[("user", "u"), ("request_id", "")][..],
        too_long,
        &[("key", "k"), ("request_id", "")],
    ] {
        let d = decide(entries).await;
        assert!(
            d.statuses[0].over_limit,
            "refused: {:?}",
            &entries[1].1[..entries[1].1.len().min(8)]
        );
    }
    let d = decide(&[("user", "u"), ("release", "")]).await;
    assert!(!d.statuses[0].over_limit);
    // Exactly the bound is an ID like any other.
    let at_bound: &'static str = Box::leak("y".repeat(256).into_boxed_str());
    let fits: &'static [(&str, &str)] =
        Box::leak(Box::new([("user", "u"), ("request_id", at_bound)]));
    assert!(ok(&l, &call(fits, None)).await);
}
