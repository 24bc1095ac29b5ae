//! Held IDs through Redis outages: releases and settlements Redis could
//! not take are kept and sent once it answers (whatever the error, with no
//! request needed), and a release frees the slot the `local` failure mode's
//! fallback took meanwhile.

use std::time::Duration;

use crate::common::redis::RedisServer;
use crate::common::{Served, ask};
use crate::held::{RULES, call, ok};

/// Releases and settlements sent while Redis is down (hung: its data kept)
/// are kept and sent once it answers again, whether or not the instance
/// gets requests: the slots are free then, not after `max_hold_seconds` (an
/// hour here), and the budget charged what the settlements said, not what
/// was reserved.
#[tokio::test(flavor = "multi_thread")]
async fn releases_sent_while_redis_is_down_free_their_slots_when_it_answers() {
    let redis = RedisServer::start();
    let server = Served::on_redis(
        RULES,
        &redis.url(),
        &["--redis-timeout", "100ms", "--redis-probe-timeout", "200ms"],
    );
    let mut client = server.client().await;
    let take = |id: &str| call(&[("user", "outage"), ("request_id", id)], None);
    let release = |id: &str| call(&[("user", "outage"), ("release", id)], None);
    let reserve = |id: &str| call(&[("tenant", "outage"), ("request_id", id)], Some(40));
    let settle = |id: &str, cost| call(&[("tenant", "outage"), ("settle", id)], Some(cost));
    for n in 0..5 {
        assert!(ok(ask(&mut client, take(&format!("s{n}")))
            .await
            .overall_code));
    }
    assert!(!ok(ask(&mut client, take("full")).await.overall_code));
    assert!(ok(ask(&mut client, reserve("r0")).await.overall_code));
    assert!(ok(ask(&mut client, reserve("r1")).await.overall_code));

    redis.signal("-STOP");
    // Other calls fail and open the circuit (a release that timed out may
    // still run when Redis wakes: these are sent while nothing is sent).
    let mut i = 0;
    let opened = crate::common::eventually(Duration::from_secs(10), async || {
        if server.metric("tollgate_store_circuit_open").await != 0 {
            return true;
        }
        i += 1;
        let other = format!("other{i}");
        ask(
            &mut client,
            call(&[("user", &other), ("request_id", "x")], None),
        )
        .await;
        false
    })
    .await;
    assert!(opened, "the circuit did not open");
    for n in 0..5 {
        assert!(ok(ask(&mut client, release(&format!("s{n}")))
            .await
            .overall_code));
    }
    // Settled while the breaker sends nothing: kept too (one that timed
    // out may have run, and a settlement charges each time it runs).
    assert!(ok(ask(&mut client, settle("r0", 5)).await.overall_code));
    assert!(ok(ask(&mut client, settle("r1", 5)).await.overall_code));
    assert_eq!(server.metric("tollgate_store_owed_releases").await, 7);
    redis.signal("-CONT");
    // (While the circuit is open a take is answered by the failure mode.)
    let closed = crate::common::eventually(Duration::from_secs(10), async || {
        server.metric("tollgate_store_circuit_open").await == 0
    })
    .await;
    assert!(closed, "the circuit did not close");

    // Once Redis answers they are sent, with no request to this instance.
    let sent = crate::common::eventually(Duration::from_secs(5), async || {
        server
            .metric("tollgate_store_owed_releases_total{result=\"sent\"}")
            .await
            == 7
    })
    .await;
    assert!(sent, "the owed releases were not sent");
    assert_eq!(server.metric("tollgate_store_owed_releases").await, 0);
    // The five slots are free again.
    for n in 0..5 {
        let taken = ask(&mut client, take(&format!("t{n}"))).await;
        assert!(ok(taken.overall_code), "slot {n}");
    }
    assert!(!ok(ask(&mut client, take("full-again")).await.overall_code));
    // 100 less the two settlements' 5 each, not the 80 reserved.
    let left = ask(&mut client, settle("probe", 0)).await.statuses[0].limit_remaining;
    assert_eq!(left, 90);
}

/// With the `local` failure mode, slots taken on the in-process fallback while
/// Redis is down are freed there by releases Redis decides once it is back:
/// the next outage finds the local cap as empty as it is.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_after_an_outage_frees_the_slot_the_fallback_holds() {
    let redis = RedisServer::start();
    let rules = "domain: held
descriptors:
  - key: user
    in_flight: {limit: 2, max_hold_seconds: 3600}
";
    let server = Served::on_redis(
        rules,
        &redis.url(),
        &[
            "--redis-timeout",
            "100ms",
            "--redis-probe-timeout",
            "200ms",
            "--failure-mode",
            "local",
        ],
    );
    let mut client = server.client().await;
    let take = |id: &str| call(&[("user", "local"), ("request_id", id)], None);
    let release = |id: &str| call(&[("user", "local"), ("release", id)], None);
    let circuit = async |open: bool, client: &mut _| {
        let mut i = 0;
        crate::common::eventually(Duration::from_secs(10), async || {
            if (server.metric("tollgate_store_circuit_open").await != 0) == open {
                return true;
            }
            if open {
                i += 1;
                let other = format!("other{i}");
                ask(client, call(&[("user", &other), ("request_id", "x")], None)).await;
            }
            false
        })
        .await
    };
    redis.signal("-STOP");
    assert!(circuit(true, &mut client).await, "the circuit did not open");
    // The fallback's cap: two slots.
    assert!(ok(ask(&mut client, take("a")).await.overall_code));
    assert!(ok(ask(&mut client, take("b")).await.overall_code));
    assert!(!ok(ask(&mut client, take("c")).await.overall_code));
    redis.signal("-CONT");
    assert!(
        circuit(false, &mut client).await,
        "the circuit did not close"
    );
    // Redis decides the releases (it holds neither ID).
    assert!(ok(ask(&mut client, release("a")).await.overall_code));
    assert!(ok(ask(&mut client, release("b")).await.overall_code));
    redis.signal("-STOP");
    assert!(
        circuit(true, &mut client).await,
        "the circuit did not open again"
    );
    assert!(
        ok(ask(&mut client, take("d")).await.overall_code),
        "slot a freed"
    );
    assert!(
        ok(ask(&mut client, take("e")).await.overall_code),
        "slot b freed"
    );
    redis.signal("-CONT");
}

/// A release Redis refuses with an error no retry is sure to mend (writes
/// refused at `maxmemory`) is kept too, and sent once Redis takes writes.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_refused_at_maxmemory_is_sent_once_redis_takes_writes() {
    let redis = RedisServer::start();
    let server = Served::on_redis(RULES, &redis.url(), &["--redis-timeout", "500ms"]);
    let mut client = server.client().await;
    let take = |id: &str| call(&[("user", "oom"), ("request_id", id)], None);
    let release = |id: &str| call(&[("user", "oom"), ("release", id)], None);
    for n in 0..5 {
        assert!(ok(ask(&mut client, take(&format!("o{n}")))
            .await
            .overall_code));
    }
    redis.cli(&["config", "set", "maxmemory", "1"]);
    for n in 0..3 {
        assert!(ok(ask(&mut client, release(&format!("o{n}")))
            .await
            .overall_code));
    }
    // Nothing was freed: Redis wrote nothing.
    assert!(!ok(ask(&mut client, take("p0")).await.overall_code));
    redis.cli(&["config", "set", "maxmemory", "0"]);
    let sent = crate::common::eventually(Duration::from_secs(5), async || {
        server
            .metric("tollgate_store_owed_releases_total{result=\"sent\"}")
            .await
            == 3
    })
    .await;
    assert!(sent, "the releases refused at maxmemory were not sent");
    for n in 1..4 {
        let taken = ask(&mut client, take(&format!("p{n}"))).await;
        assert!(ok(taken.overall_code), "slot {n}");
    }
    assert!(!ok(ask(&mut client, take("p4")).await.overall_code));
}
