//! In-flight caps and reservations (issue 42) on the memory store, a real
//! Redis and a real Redis Cluster: racing clients get exactly the cap's
//! slots and never overdraw a budget by concurrency; releases and
//! settlements of refused, unknown or repeated IDs change nothing they
//! should not; a request refused elsewhere (another descriptor, another
//! hash slot) holds nothing; what no script wrote reads as nothing held.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{Served, ask, request};

pub(crate) const RULES: &str = "domain: held
descriptors:
  - key: user
    in_flight: {limit: 5, max_hold_seconds: 3600}
  - key: tenant
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 100, algorithm: fixed_window, budget: true, reserve: true}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 0}
";

/// The operator's token (resets need one).
const TOKEN: &str = "held-ids-operator-token-0123456789abcdef";

pub(crate) fn call(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitRequest {
    let mut r = request("held", &[entries]);
    r.descriptors[0].hits_addend = hits.map(|value| UInt64Value { value });
    r
}

pub(crate) fn ok(code: i32) -> bool {
    code == Code::Ok as i32
}

/// 20 clients race 3 takes each for 5 slots: exactly 5; each holder's
/// release frees its own slot only, once.
async fn racing_takes_get_exactly_the_slots(server: &Served, user: &str) {
    let mut tasks = Vec::new();
    for c in 0..20 {
        let mut client = server.client().await;
        let user = user.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut held = Vec::new();
            for n in 0..3 {
                let id = format!("c{c}-{n}");
                let answer = ask(
                    &mut client,
                    call(&[("user", &user), ("request_id", &id)], None),
                )
                .await;
                if ok(answer.overall_code) {
                    held.push(id);
                }
            }
            held
        }));
    }
    let mut held = Vec::new();
    for task in tasks {
        held.extend(task.await.expect("client"));
    }
    assert_eq!(held.len(), 5, "{held:?}");
    let mut client = server.client().await;
    let take = |id: &str| call(&[("user", user), ("request_id", id)], None);
    let release = |id: &str| call(&[("user", user), ("release", id)], None);
    // Refused and unknown IDs' releases free nothing.
    for id in ["c0-9", "nobody", "c19-2"] {
        if !held.iter().any(|h| h == id) {
            assert!(ok(ask(&mut client, release(id)).await.overall_code));
        }
    }
    assert!(!ok(ask(&mut client, take("late")).await.overall_code));
    // One holder's release, twice: one slot.
    assert!(ok(ask(&mut client, release(&held[0])).await.overall_code));
    assert!(ok(ask(&mut client, release(&held[0])).await.overall_code));
    assert!(ok(ask(&mut client, take("late")).await.overall_code));
    assert!(!ok(ask(&mut client, take("later")).await.overall_code));
    assert!(
        !ok(ask(&mut client, take(&held[1])).await.overall_code),
        "a held ID takes no second slot"
    );
}

/// 30 clients reserve 10 each of a budget of 100: 10 fit. Settled smaller
/// and larger than reserved; refused IDs' settlements charge only their cost.
async fn racing_reservations_never_overdraw(server: &Served, tenant: &str) {
    let mut tasks = Vec::new();
    for c in 0..30 {
        let mut client = server.client().await;
        let tenant = tenant.to_owned();
        tasks.push(tokio::spawn(async move {
            let id = format!("r{c}");
            let answer = ask(
                &mut client,
                call(&[("tenant", &tenant), ("request_id", &id)], Some(10)),
            )
            .await;
            ok(answer.overall_code).then_some(id)
        }));
    }
    let mut admitted = Vec::new();
    for task in tasks {
        admitted.extend(task.await.expect("client"));
    }
    assert_eq!(admitted.len(), 10, "{admitted:?}");
    let mut client = server.client().await;
    let settle = |id: &str, cost: u64| call(&[("tenant", tenant), ("settle", id)], Some(cost));
    let left = async |client: &mut _| {
        let answer = ask(client, settle("probe", 0)).await;
        answer.statuses[0].limit_remaining
    };
    assert_eq!(left(&mut client).await, 0);
    // Eight settle at 4 (48 back), one at 10, one at 25 (15 more).
    for (i, id) in admitted.iter().enumerate() {
        let cost = match i {
            8 => 10,
            9 => 25,
            _ => 4,
        };
        assert!(ok(ask(&mut client, settle(id, cost)).await.overall_code));
    }
    assert_eq!(left(&mut client).await, 100 - (8 * 4 + 10 + 25));
    // Settled again, or a refused ID settled: charged its cost, no refund.
    assert!(ok(ask(&mut client, settle(&admitted[0], 3))
        .await
        .overall_code));
    assert_eq!(left(&mut client).await, 100 - (8 * 4 + 10 + 25 + 3));
}

/// A take and a reservation whose request is refused by another
/// descriptor hold nothing (on a Cluster, another slot: refunded).
async fn a_refused_request_holds_nothing(server: &Served) {
    let mut client = server.client().await;
    for n in 0..8 {
        let id = format!("x{n}");
        let r = RateLimitRequest {
            descriptors: vec![
                call(&[("user", "dora"), ("request_id", &id)], None)
                    .descriptors
                    .remove(0),
                call(&[("tenant", "dora"), ("request_id", &id)], Some(20))
                    .descriptors
                    .remove(0),
                call(&[("closed", "x")], None).descriptors.remove(0),
            ],
            ..request("held", &[])
        };
        assert!(!ok(ask(&mut client, r).await.overall_code));
    }
    for n in 0..5 {
        let id = format!("y{n}");
        assert!(
            ok(ask(
                &mut client,
                call(&[("user", "dora"), ("request_id", &id)], None)
            )
            .await
            .overall_code),
            "slot {n}"
        );
        assert!(
            ok(ask(
                &mut client,
                call(&[("tenant", "dora"), ("request_id", &id)], Some(20))
            )
            .await
            .overall_code),
            "reservation {n}"
        );
    }
    // A stream-end call carrying a refused descriptor still releases.
    let r = RateLimitRequest {
        descriptors: vec![
            call(&[("user", "dora"), ("release", "y0")], None)
                .descriptors
                .remove(0),
            call(&[("closed", "x")], None).descriptors.remove(0),
        ],
        ..request("held", &[])
    };
    assert!(!ok(ask(&mut client, r).await.overall_code));
    assert!(ok(ask(
        &mut client,
        call(&[("user", "dora"), ("request_id", "z")], None)
    )
    .await
    .overall_code));
}

/// `--max-held-ids 12`: a thirteenth open reservation of one key is
/// refused, though the budget has room; a settlement makes room.
async fn a_key_holds_at_most_its_bound(server: &Served, tenant: &str) {
    let mut client = server.client().await;
    for n in 0..13 {
        let id = format!("b{n}");
        let answer = ask(
            &mut client,
            call(&[("tenant", tenant), ("request_id", &id)], Some(1)),
        )
        .await;
        assert_eq!(ok(answer.overall_code), n < 12, "reservation {n}");
    }
    let settle = call(&[("tenant", tenant), ("settle", "b0")], Some(1));
    assert!(ok(ask(&mut client, settle).await.overall_code));
    let again = call(&[("tenant", tenant), ("request_id", "b12")], Some(1));
    assert!(ok(ask(&mut client, again).await.overall_code));
}

async fn everything(server: &Served, tag: &str) {
    a_key_holds_at_most_its_bound(server, &format!("bound-{tag}")).await;
    racing_takes_get_exactly_the_slots(server, &format!("ann-{tag}")).await;
    racing_reservations_never_overdraw(server, &format!("acme-{tag}")).await;
    a_refused_request_holds_nothing(server).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn held_ids_on_the_memory_store() {
    everything(&Served::start(RULES, &["--max-held-ids", "12"]), "m").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn held_ids_on_redis_and_a_cluster() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = crate::common::token_file(dir.path(), "tokens", &format!("{TOKEN}\n"));
    let server = Served::on_redis(
        RULES,
        &redis.url(),
        &[
            "--redis-timeout",
            "2s",
            "--max-held-ids",
            "12",
            "--admin-token-file",
            &tokens,
        ],
    );
    everything(&server, "r").await;
    let keys: Vec<(String, i64)> = redis.counters_with_ttl();
    assert!(
        keys.iter()
            .any(|(k, ttl)| k.ends_with("|user=ann-r}:if") && *ttl > 0),
        "a cap's held IDs, with an expiry: {keys:?}"
    );
    assert!(
        keys.iter()
            .any(|(k, ttl)| k.ends_with(":h") && k.contains("tenant=dora") && *ttl > 0),
        "a budget's reservations beside its counter: {keys:?}"
    );
    values_no_script_wrote_hold_nothing(&redis, &server).await;
    a_rule_reset_frees_the_caps_slots(&server).await;

    let cluster = RedisCluster::start();
    let server = Served::on_cluster(
        RULES,
        &cluster.urls(),
        &["--redis-timeout", "2s", "--max-held-ids", "12"],
    );
    everything(&server, "c").await;
}

/// A list of held IDs holding what no script wrote reads as nothing held.
async fn values_no_script_wrote_hold_nothing(redis: &RedisServer, server: &Served) {
    let mut client = server.client().await;
    for (i, poison) in ["{1, 2, 3}", "{'a', -1, 5}", "{'a', 1, 0/0}", "'junk'"]
        .iter()
        .enumerate()
    {
        let user = format!("poisoned-{i}");
        let key = format!("tollgate:{{held|user={user}}}:if");
        redis.poison(&key, poison);
        for n in 0..6 {
            let id = format!("p{n}");
            let answer = ask(
                &mut client,
                call(&[("user", &user), ("request_id", &id)], None),
            )
            .await;
            assert_eq!(ok(answer.overall_code), n < 5, "{poison}: take {n}");
        }
    }
}

/// An operator's reset of the cap's rule frees every slot it holds.
async fn a_rule_reset_frees_the_caps_slots(server: &Served) {
    let mut client = server.client().await;
    for n in 0..6 {
        let id = format!("f{n}");
        let answer = ask(
            &mut client,
            call(&[("user", "full"), ("request_id", &id)], None),
        )
        .await;
        assert_eq!(ok(answer.overall_code), n < 5, "take {n}");
    }
    let body =
        r#"{"domain": "held", "rule": "held.user/in_flight", "confirm": "held.user/in_flight"}"#;
    let reset = crate::common::envoy::http_with_body(
        server.admin,
        "POST",
        "/counters/reset",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &format!("Bearer {TOKEN}")),
        ],
        body,
    )
    .expect("admin answers");
    assert_eq!(reset.status, 200, "{reset:?}");
    assert!(!reset.body.contains("\"reset\":0"), "{reset:?}");
    let answer = ask(
        &mut client,
        call(&[("user", "full"), ("request_id", "after")], None),
    )
    .await;
    assert!(ok(answer.overall_code), "the slots are free");
}
