//! Redis Cluster faults with real processes: a master that hangs (SIGSTOP,
//! and listed among the seeds) costs only its own slots, which come back
//! when its replica is promoted; a live reshard (`redis-cli --cluster
//! reshard`) of sliding windows is followed with no failure-mode answers.
//!
//! Limits are far above the traffic and the failure mode is `deny`, so every
//! refusal is a failure-mode answer.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common::redis::RedisCluster;
use crate::common::{Tollgate, ask, eventually, request, wait_until};

/// One Cluster at a time: these tests measure timings (recovery, a reshard
/// within request deadlines) that a neighbouring six-node Cluster being
/// killed and promoted on this 2-core machine would distort.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const RULES: &str = "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";

fn on(cluster: &RedisCluster) -> Tollgate {
    on_with(cluster, RULES)
}

/// Tollgate with `rules` on `cluster`, failing closed.
fn on_with(cluster: &RedisCluster, rules: &str) -> Tollgate {
    let urls = cluster.urls();
    Tollgate::start(
        rules,
        &[
            "--store",
            "redis-cluster",
            "--redis-url",
            &urls,
            "--failure-mode",
            "deny",
        ],
    )
}

/// The hash tag of user `name`'s counters.
fn tag(name: &str) -> String {
    format!("{{t|user={name}}}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_master_costs_only_its_slots_and_they_return_when_its_replica_is_promoted() {
    master_fails("-STOP").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_master_costs_only_its_slots_and_they_return_when_its_replica_is_promoted() {
    master_fails("-KILL").await;
}

/// A master of a 3+3 Cluster gets `signal` (SIGSTOP: hung, its connections
/// open and unanswered; SIGKILL: gone, connections refused).
async fn master_fails(signal: &str) {
    let _one = ONE_AT_A_TIME.lock().await;
    // Redis's default `cluster-require-full-coverage yes` stops every
    // master while one is failed and not yet replaced: Redis's own outage,
    // the README's failure table says. Here the healthy masters keep serving.
    let cluster = RedisCluster::start_with(
        1,
        &[
            "--cluster-node-timeout",
            "1000",
            "--cluster-require-full-coverage",
            "no",
        ],
    );
    let server = on(&cluster);
    let mut client = server.client().await;
    let hung = 1;
    assert_eq!(cluster.nodes[hung].role(), "master");
    let (mut on_hung, mut elsewhere) = (Vec::new(), Vec::new());
    for i in 0..60 {
        let name = format!("u{i}");
        if cluster.master_of(&tag(&name)) == hung {
            on_hung.push(name);
        } else {
            elsewhere.push(name);
        }
    }
    assert!(
        on_hung.len() >= 3 && elsewhere.len() >= 3,
        "users on both sides"
    );
    for name in on_hung.iter().chain(&elsewhere) {
        let code = ask(&mut client, request("t", &[&[("user", name)]]))
            .await
            .overall_code;
        assert_eq!(code, 1, "{name} before the fault");
    }

    cluster.nodes[hung].signal(signal);
    let stopped = Instant::now();
    let mut promoted: Option<Duration> = None;
    let mut last_role_check = Instant::now();
    let (mut healthy_refused, mut healthy_asked) = (0, 0);
    let mut hung_answers: Vec<(Duration, i32)> = Vec::new();
    let mut i = 0;
    loop {
        let at = stopped.elapsed();
        assert!(at < Duration::from_secs(30), "no promotion within 30 s");
        let name = &elsewhere[i % elsewhere.len()];
        let code = ask(&mut client, request("t", &[&[("user", name)]]))
            .await
            .overall_code;
        healthy_asked += 1;
        if code != 1 {
            healthy_refused += 1;
        }
        let name = &on_hung[i % on_hung.len()];
        let code = ask(&mut client, request("t", &[&[("user", name)]]))
            .await
            .overall_code;
        hung_answers.push((at, code));
        i += 1;
        if promoted.is_none() && last_role_check.elapsed() > Duration::from_millis(50) {
            last_role_check = Instant::now();
            let masters = cluster.nodes[3..]
                .iter()
                .filter(|n| n.role() == "master")
                .count();
            if masters > 0 {
                promoted = Some(stopped.elapsed());
            }
        }
        if let Some(p) = promoted
            && at > p + Duration::from_secs(3)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if signal == "-STOP" {
        cluster.nodes[hung].signal("-CONT");
    }
    let promoted = promoted.expect("promoted");
    let recovered = hung_answers
        .iter()
        .filter(|(at, code)| *code == 1 && *at > Duration::from_millis(1))
        .map(|(at, _)| *at)
        .next()
        .expect("the hung master's users were decided again");
    let after: Vec<_> = hung_answers
        .iter()
        .filter(|(at, _)| *at >= recovered)
        .collect();
    let refused_before = hung_answers
        .iter()
        .filter(|(at, c)| *at < recovered && *c != 1)
        .count();
    eprintln!(
        "{signal}: promoted at {promoted:?}; its users decided again at {recovered:?} ({refused_before} failure-mode answers before); \
         other masters' users: {healthy_refused} of {healthy_asked} refused"
    );
    assert_eq!(
        healthy_refused, 0,
        "users on healthy masters got failure-mode answers"
    );
    assert!(
        refused_before > 0,
        "the hung master's users were not affected at all?"
    );
    assert!(
        recovered <= promoted + Duration::from_millis(500),
        "the hung master's slots came back {:?} after the promotion",
        recovered.saturating_sub(promoted)
    );
    assert!(
        after.iter().all(|(_, code)| *code == 1),
        "after recovery: {after:?}"
    );
    assert_eq!(server.log_count("Redis Cluster master unavailable"), 1);
    assert_eq!(
        server.log_count("Redis unavailable"),
        0,
        "no store-wide outage"
    );
    assert!(server.log_count("slots moved") >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_reshard_of_sliding_windows_gets_no_failure_mode_answers() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start();
    let server = on(&cluster);
    let users: Vec<String> = (0..200).map(|i| format!("r{i}")).collect();
    // The reshard takes the source's lowest slots: a user in one of them.
    let slot = |name: &str| -> usize {
        cluster.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", &tag(name)])
            .trim()
            .parse()
            .expect("a slot")
    };
    let watched = users
        .iter()
        .find(|u| slot(u) % 5461 < 1500 && slot(u) < 16_380)
        .expect("a user in the slots that move")
        .clone();
    let from = cluster.master_of(&tag(&watched));
    let to = (from + 1) % 3;
    let id = |n: usize| cluster.nodes[n].cli(&["CLUSTER", "MYID"]).trim().to_owned();
    let (from_id, to_id) = (id(from), id(to));
    // Traffic on every user, from several streams, while the reshard runs.
    // Each stream asks for every 8th user; its answers so far are counted,
    // so the test knows when each has been round all its users.
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let answered: std::sync::Arc<Vec<AtomicU64>> =
        std::sync::Arc::new((0..8).map(|_| AtomicU64::new(0)).collect());
    let round = (users.len() / 8) as u64;
    let rounds_done = |answered: &[AtomicU64], since: &[u64]| {
        answered
            .iter()
            .zip(since)
            .all(|(a, s)| a.load(Ordering::Relaxed) >= s + round)
    };
    let snapshot = |answered: &[AtomicU64]| -> Vec<u64> {
        answered.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    };
    let mut streams = Vec::new();
    for s in 0..8 {
        let mut client = server.client().await;
        let users = users.clone();
        let stop = stop.clone();
        let answered = answered.clone();
        streams.push(tokio::spawn(async move {
            let (mut admitted, mut refused) = (HashMap::<String, u64>::new(), 0u64);
            let mut i = s;
            while !stop.load(Ordering::Relaxed) {
                let name = &users[i % users.len()];
                match ask(&mut client, request("t", &[&[("user", name)]]))
                    .await
                    .overall_code
                {
                    1 => *admitted.entry(name.clone()).or_default() += 1,
                    _ => refused += 1,
                }
                answered[s].fetch_add(1, Ordering::Relaxed);
                i += 8;
            }
            (admitted, refused)
        }));
    }
    // Every user has a window in Redis before the reshard starts.
    let zero = vec![0; 8];
    assert!(
        eventually(Duration::from_secs(30), async || rounds_done(
            &answered, &zero
        ))
        .await,
        "traffic before the reshard"
    );
    let port = cluster.nodes[from].port.to_string();
    let slots = "2000";
    let reshard = tokio::task::spawn_blocking(move || {
        std::process::Command::new("redis-cli")
            .args(["--cluster", "reshard", &format!("127.0.0.1:{port}")])
            .args(["--cluster-from", &from_id, "--cluster-to", &to_id])
            .args(["--cluster-slots", slots, "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster reshard")
    })
    .await
    .expect("reshard");
    assert!(
        reshard.status.success(),
        "reshard: {}",
        String::from_utf8_lossy(&reshard.stdout)
    );
    // And every user is asked again after it, the moved ones on their new
    // master.
    let after = snapshot(&answered);
    assert!(
        eventually(Duration::from_secs(30), async || rounds_done(
            &answered, &after
        ))
        .await,
        "traffic after the reshard"
    );
    stop.store(true, Ordering::Relaxed);
    let (mut by_user, mut refused) = (HashMap::<String, u64>::new(), 0);
    for stream in streams {
        let (a, r) = stream.await.expect("stream");
        for (user, n) in a {
            *by_user.entry(user).or_default() += n;
        }
        refused += r;
    }
    let admitted: u64 = by_user.values().sum();
    let moved = cluster.master_of(&tag(&watched));
    eprintln!(
        "reshard of 2000 slots: {admitted} admitted, {refused} refused; {watched} moved from node {from} to {moved}"
    );
    assert_eq!(moved, to, "the slot moved");
    assert_eq!(refused, 0, "failure-mode answers during the reshard");
    assert_eq!(server.metric("tollgate_store_circuit_open_total"), 0);
    // Every admitted request is counted once, wherever its key ended up:
    // per user, the hits on every node that holds one of its windows.
    let mut counted: HashMap<String, Vec<(usize, String, u64)>> = HashMap::new();
    for (n, node) in cluster.nodes.iter().enumerate() {
        for key in node.cli(&["--scan", "--pattern", "*:sw:*"]).lines() {
            if key.is_empty() {
                continue;
            }
            let hits = node.cli(&["GET", key]).trim().parse::<u64>().unwrap_or(0);
            let user = key
                .split_once("user=")
                .and_then(|(_, rest)| rest.split_once('}'))
                .map_or("", |(user, _)| user);
            counted
                .entry(user.to_owned())
                .or_default()
                .push((n, key.to_owned(), hits));
        }
    }
    let wrong: Vec<String> = by_user
        .iter()
        .filter_map(|(user, &admitted)| {
            let keys = counted.get(user).map_or(&[][..], Vec::as_slice);
            let hits: u64 = keys.iter().map(|(_, _, h)| h).sum();
            (hits != admitted).then(|| {
                let slot = slot(user);
                format!("{user} (slot {slot}): {admitted} admitted, counted {keys:?}")
            })
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "hits counted in Redis differ from the admitted ones for {} users:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    let total: u64 = counted.values().flatten().map(|(_, _, h)| h).sum();
    assert_eq!(total, admitted, "hits counted in Redis");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_refused_because_one_of_its_slots_failed_spends_nothing_in_the_others() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start();
    let rules = "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n  - key: org\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";
    let urls = cluster.urls();
    let server = Tollgate::start(
        rules,
        &[
            "--store",
            "redis-cluster",
            "--redis-url",
            &urls,
            "--failure-mode",
            "deny",
        ],
    );
    let mut client = server.client().await;
    let user = "ann";
    let user_master = cluster.master_of(&tag(user));
    let org = (0..100)
        .map(|i| format!("org{i}"))
        .find(|o| cluster.master_of(&format!("{{t|org={o}}}")) != user_master)
        .expect("an org on another master");
    let org_master = cluster.master_of(&format!("{{t|org={org}}}"));
    let both = || request("t", &[&[("user", user)], &[("org", &org)]]);
    assert_eq!(ask(&mut client, both()).await.overall_code, 1);

    cluster.nodes[org_master].signal("-STOP");
    for _ in 0..12 {
        assert_eq!(
            ask(&mut client, both()).await.overall_code,
            2,
            "refused by the failure mode"
        );
    }
    cluster.nodes[org_master].signal("-CONT");
    // Calls the stopped master received now run, late; their cancellations
    // follow them, and once none is pending, all have run.
    let t = &server;
    tokio::task::block_in_place(|| {
        wait_until("the cancellations", Duration::from_secs(20), || {
            t.metric("tollgate_store_cancellations_pending") == 0
        })
    });
    assert!(server.metric("tollgate_store_cancellations_total{result=\"delivered\"}") >= 1);
    assert_eq!(
        server.metric("tollgate_store_cancellations_total{result=\"abandoned\"}"),
        0
    );
    let count = |node: usize, needle: &str| -> u64 {
        let n = &cluster.nodes[node];
        n.counter_names()
            .lines()
            .filter(|k| k.contains(needle))
            .map(|k| n.cli(&["GET", k]).trim().parse::<u64>().unwrap_or(0))
            .sum()
    };
    assert_eq!(
        count(user_master, "user=ann"),
        1,
        "the healthy slot spent nothing for refusals"
    );
    assert_eq!(
        count(org_master, &format!("org={org}")),
        1,
        "the stopped master's late calls spent nothing"
    );
}

/// A slot of 100,000 keys migrated live, 100 keys per `MIGRATE` (about the
/// pace of `redis-cli --cluster reshard`), while requests for descriptors
/// in that slot keep coming: fixed and sliding windows by the hour (their
/// counts checked after), sliding windows by the second (a new window
/// every second, whose previous window may be on either node), and a
/// descriptor with two limits (a request of two checks, all or nothing). Half the
/// names are asked first during the migration, so their keys are new on a
/// migrating slot. Every answer must come from Redis, and every admitted
/// hit must be counted once.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_migration_of_a_slot_of_100000_keys_is_decided_by_redis() {
    use crate::common::redis::slot_of;
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start();
    let rules = "domain: m\ndescriptors:\n  - key: f\n    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: fixed_window}\n  - key: s\n    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: sliding_window}\n  - key: r\n    rate_limit: {unit: second, requests_per_unit: 1000000, algorithm: sliding_window}\n  - key: w\n    rate_limits:\n      - {unit: hour, requests_per_unit: 1000000, algorithm: fixed_window}\n      - {unit: day, requests_per_unit: 1000000, algorithm: fixed_window}\n";
    let server = on_with(&cluster, rules);
    let tag = |kind: &str, name: &str| format!("{{m|{kind}={name}}}");
    let slot = slot_of(&tag("f", "u0"));
    // Eight names per kind in that slot: four asked from the start, four
    // first asked once the migration runs.
    let names = |kind: &str| -> Vec<String> {
        (0..)
            .map(|i| format!("u{i}"))
            .filter(|n| slot_of(&tag(kind, n)) == slot)
            .take(8)
            .collect()
    };
    let all: Vec<(&str, String)> = ["f", "s", "r", "w"]
        .iter()
        .flat_map(|&k| names(k).into_iter().map(move |n| (k, n)))
        .collect();
    let from = cluster.master_of(&tag("f", "u0"));
    let to = (from + 1) % 3;
    let filled = cluster.nodes[from].cli(&[
        "DEBUG",
        "POPULATE",
        "100000",
        &format!("{}:fill", tag("f", "u0")),
    ]);
    assert_eq!(filled.trim(), "OK");

    let migrating = std::sync::Arc::new(AtomicBool::new(false));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let during = std::sync::Arc::new(AtomicU64::new(0));
    let mut streams = Vec::new();
    for s in 0..6 {
        let mut client = server.client().await;
        let (all, migrating, stop, during) =
            (all.clone(), migrating.clone(), stop.clone(), during.clone());
        streams.push(tokio::spawn(async move {
            // Per kind: admitted, refused.
            let mut tally: std::collections::HashMap<&str, (u64, u64)> = Default::default();
            let mut i = s;
            while !stop.load(Ordering::Relaxed) {
                let now_migrating = migrating.load(Ordering::Relaxed);
                let (kind, name) = &all[i % all.len()];
                i += 1;
                // The second half of each kind's names waits for the migration.
                let late = all
                    .iter()
                    .filter(|(k, _)| k == kind)
                    .position(|(_, n)| n == name)
                    >= Some(4);
                if late && !now_migrating {
                    continue;
                }
                let code = ask(&mut client, request("m", &[&[(kind, name)]]))
                    .await
                    .overall_code;
                let entry = tally.entry(kind).or_default();
                if code == 1 {
                    entry.0 += 1;
                } else {
                    entry.1 += 1;
                }
                if now_migrating && migrating.load(Ordering::Relaxed) {
                    during.fetch_add(1, Ordering::Relaxed);
                }
            }
            tally
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    migrating.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let c = &cluster;
    let moved = tokio::task::block_in_place(|| c.migrate_slot(slot, from, to, 100));
    let took = started.elapsed();
    migrating.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut tally: std::collections::HashMap<&str, (u64, u64)> = Default::default();
    for stream in streams {
        for (kind, (a, r)) in stream.await.expect("stream") {
            let entry = tally.entry(kind).or_default();
            entry.0 += a;
            entry.1 += r;
        }
    }
    let during = during.load(Ordering::Relaxed);
    eprintln!(
        "slot {slot}: {moved} keys moved from node {from} to {to} in {took:?}; {during} answers during it; admitted, refused per kind: {tally:?}"
    );
    assert!(moved >= 100_000, "the slot held the filler keys");
    assert_eq!(cluster.master_of(&tag("f", "u0")), to, "the slot moved");
    assert!(
        during >= 100,
        "traffic on the slot while it migrated ({during} answers)"
    );
    let refused: u64 = tally.values().map(|(_, r)| r).sum();
    assert_eq!(refused, 0, "failure-mode answers during the migration");
    // Every admitted hit counted once, on whichever node its key is now
    // (twice for w: its two limits).
    for (kind, limits) in [("f", 1), ("s", 1), ("w", 2)] {
        let counted: u64 = cluster
            .nodes
            .iter()
            .flat_map(|n| {
                n.cli(&["--scan", "--pattern", &format!("*{{m|{kind}=*")])
                    .lines()
                    .filter(|k| {
                        !k.is_empty()
                            && !k.contains(":fill:")
                            && !crate::common::redis::is_receipt(k)
                    })
                    .map(|k| n.cli(&["GET", k]).trim().parse::<u64>().unwrap_or(0))
                    .collect::<Vec<_>>()
            })
            .sum();
        assert_eq!(
            counted,
            limits * tally[kind].0,
            "{kind}: hits counted in Redis"
        );
    }
}
