//! The memory store kept in a data directory (`--data-dir`): a restart
//! after a clean stop or a `kill -9` continues every counter exactly (six
//! shapes of limit), a reset stays reset, counters of a removed rule are
//! dropped while a changed limit keeps its own, and the file follows the
//! live keys. Faults are in `durable_faults.rs`.

use std::time::Duration;

use serde_json::json;

use crate::common::envoy::http_with_body;
use crate::common::{Tollgate, ask, descriptor, wait_until};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// One limit of each shape, each with a window far longer than a test
/// (3650 days, a calendar year), so no window edge can pass during one.
pub(crate) const SHAPES: &str = "domain: keep
descriptors:
  - key: fixed
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 1000, algorithm: fixed_window}
  - key: sliding
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 1000, algorithm: sliding_window}
  - key: bucket
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 1000, algorithm: token_bucket}
  - key: calendar
    rate_limit: {unit: year, calendar: true, requests_per_unit: 1000}
  - key: budget
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 1000, algorithm: fixed_window, budget: true}
  - key: log
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 100, algorithm: sliding_log}
";

const KEYS: [&str; 6] = ["fixed", "sliding", "bucket", "calendar", "budget", "log"];

/// A server on `rules` keeping its counters in `dir`.
pub(crate) fn serve(rules: &str, dir: &std::path::Path, extra: &[&str]) -> Tollgate {
    let dir = dir.to_str().expect("a UTF-8 path");
    let mut args = vec!["--data-dir", dir, "--shutdown-delay", "10ms"];
    args.extend_from_slice(extra);
    Tollgate::start(rules, &args)
}

/// Stops `server` with SIGTERM (the drain, then the last flush); it must
/// exit cleanly.
pub(crate) fn stop(mut server: Tollgate) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status();
    let status = server.child.wait().expect("wait");
    assert!(status.success(), "a clean stop: {status:?}");
}

/// Kills `server` with SIGKILL once a flush has begun after now.
pub(crate) fn crash_after_flush(mut server: Tollgate) {
    let seen = server.metric("tollgate_data_flushes_total");
    wait_until("two more flushes", Duration::from_secs(10), || {
        server.metric("tollgate_data_flushes_total") >= seen + 2
    });
    server.child.kill().expect("SIGKILL");
    let _ = server.child.wait();
}

fn request(key: &str, user: &str, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "keep".into(),
        descriptors: vec![descriptor(&[(key, user)])],
        hits_addend: hits,
    }
}

/// Spends on every shape for three users (different amounts); returns
/// each (shape, user)'s remaining count after.
async fn spend(server: &Tollgate) -> Vec<(String, u32)> {
    let mut client = server.client().await;
    let mut remaining = Vec::new();
    for key in KEYS {
        for (u, user) in ["ann", "bob", "cy"].iter().enumerate() {
            let mut last = 0;
            for i in 0..(3 + u as u32) {
                let r = ask(&mut client, request(key, user, 1 + (i % 3))).await;
                last = r.statuses[0].limit_remaining;
            }
            remaining.push((format!("{key}/{user}"), last));
        }
    }
    remaining
}

/// After a restart: one more hit on each; what each has left.
async fn one_more(server: &Tollgate) -> Vec<(String, u32)> {
    let mut client = server.client().await;
    let mut remaining = Vec::new();
    for key in KEYS {
        for user in ["ann", "bob", "cy"] {
            let r = ask(&mut client, request(key, user, 1)).await;
            remaining.push((format!("{key}/{user}"), r.statuses[0].limit_remaining));
        }
    }
    remaining
}

fn less_one(before: &[(String, u32)]) -> Vec<(String, u32)> {
    before.iter().map(|(k, n)| (k.clone(), n - 1)).collect()
}

#[tokio::test]
async fn a_clean_stop_and_a_restart_continue_every_counter_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = serve(SHAPES, dir.path(), &[]);
    let before = spend(&server).await;
    let fresh = |k: &str| if k.starts_with("log") { 99 } else { 999 };
    assert!(
        before.iter().all(|(k, n)| *n < fresh(k)),
        "spent: {before:?}"
    );
    let body = server.metrics();
    let data = crate::operations::data_dir_metrics();
    assert!(data.len() >= 5, "docs/metrics.md marks them: {data:?}");
    for name in &data {
        assert!(
            body.lines().any(|l| l.starts_with(name.as_str())),
            "{name} missing from /metrics with --data-dir"
        );
    }
    stop(server);
    let server = serve(SHAPES, dir.path(), &[]);
    assert_eq!(one_more(&server).await, less_one(&before));
    assert_eq!(
        server.log_count("counters restored from the data directory"),
        1
    );
}

#[tokio::test]
async fn a_kill_after_a_flush_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = serve(SHAPES, dir.path(), &["--data-flush-interval", "100ms"]);
    let before = spend(&server).await;
    crash_after_flush(server);
    let server = serve(SHAPES, dir.path(), &[]);
    assert_eq!(one_more(&server).await, less_one(&before));
}

const TOKEN: &str = "ops:0123456789abcdef0123";

#[tokio::test]
async fn a_reset_stays_reset_after_a_kill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = crate::common::token_file(dir.path(), "tokens", &format!("{TOKEN}\n"));
    let data = dir.path().join("data");
    // A long flush interval: only the reset's own flush can write it.
    let args = [
        "--admin-token-file",
        tokens.as_str(),
        "--data-flush-interval",
        "60m",
    ];
    let server = serve(SHAPES, &data, &args);
    let before = spend(&server).await;
    stop(server);
    let mut server = serve(SHAPES, &data, &args);
    let body =
        json!({"domain": "keep", "descriptors": [{"entries": [{"key": "fixed", "value": "ann"}]}]});
    let r = http_with_body(
        server.admin,
        "POST",
        "/counters/reset",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", "Bearer 0123456789abcdef0123"),
        ],
        &body.to_string(),
    )
    .expect("admin answers");
    assert_eq!(r.status, 200, "{}", r.body);
    server.child.kill().expect("SIGKILL right after the answer");
    let _ = server.child.wait();
    let server = serve(SHAPES, &data, &args);
    let after = one_more(&server).await;
    for ((key, was), (_, now)) in before.iter().zip(&after) {
        let expected = if key == "fixed/ann" { 999 } else { was - 1 };
        assert_eq!(*now, expected, "{key}");
    }
}

#[tokio::test]
async fn a_removed_rule_drops_its_counters_and_a_changed_limit_keeps_its_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let both = "domain: keep\ndescriptors:\n  - key: kept\n    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 100}\n  - key: gone\n    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 100}\n";
    let server = serve(both, dir.path(), &[]);
    let mut client = server.client().await;
    for _ in 0..10 {
        ask(&mut client, request("kept", "x", 1)).await;
        ask(&mut client, request("gone", "x", 1)).await;
    }
    stop(server);
    // `gone` removed; `kept` now allows 200.
    let changed = "domain: keep\ndescriptors:\n  - key: kept\n    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 200}\n";
    let server = serve(changed, dir.path(), &[]);
    assert_eq!(server.log_count("rules_gone=1"), 1, "one counter dropped");
    let mut client = server.client().await;
    let r = ask(&mut client, request("kept", "x", 1)).await;
    assert_eq!(
        r.statuses[0].limit_remaining,
        200 - 11,
        "the changed limit kept its count"
    );
    stop(server);
    // `gone` back: its counter starts afresh.
    let server = serve(both, dir.path(), &[]);
    let mut client = server.client().await;
    let r = ask(&mut client, request("gone", "x", 1)).await;
    assert_eq!(r.statuses[0].limit_remaining, 99);
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read the data directory")
        .flatten()
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

#[tokio::test]
async fn the_files_follow_the_live_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Windows of 15 s: long enough for a debug build beside the other
    // tests to send every key (5 s was not, once), short enough to wait out.
    let rules = "domain: keep\ndescriptors:\n  - key: brief\n    rate_limit: {unit: second, unit_multiplier: 15, requests_per_unit: 5, algorithm: fixed_window}\n";
    let server = serve(
        rules,
        dir.path(),
        &["--data-flush-interval", "200ms", "--max-descriptors", "200"],
    );
    let mut client = server.client().await;
    let users: Vec<String> = (0..200_000).map(|i| format!("user-{i}")).collect();
    for batch in users.chunks(200) {
        let descriptors = batch.iter().map(|u| descriptor(&[("brief", u)])).collect();
        let r = RateLimitRequest {
            domain: "keep".into(),
            descriptors,
            hits_addend: 1,
        };
        ask(&mut client, r).await;
    }
    wait_until("most keys written", Duration::from_secs(10), || {
        server.metric("tollgate_data_keys") > 150_000
    });
    let peak = dir_bytes(dir.path());
    wait_until(
        "every key expired and dropped",
        Duration::from_secs(45),
        || server.metric("tollgate_data_keys") == 0,
    );
    wait_until("the file compacted", Duration::from_secs(10), || {
        dir_bytes(dir.path()) < peak / 4
    });
    let expired = dir_bytes(dir.path());
    stop(server);
    let stopped = dir_bytes(dir.path());
    let server = serve(rules, dir.path(), &[]);
    let restarted = dir_bytes(dir.path());
    eprintln!(
        "200,000 keys: {peak} bytes; expired: {expired}; stopped: {stopped}; restarted: {restarted}"
    );
    assert!(peak > 200_000 * 40, "the keys were written: {peak} bytes");
    assert!(
        stopped < 1 << 20 && restarted < 1 << 20,
        "{stopped}, {restarted}"
    );
    drop(server);
}

/// A request of one descriptor holding, freeing or settling an ID.
fn held_call(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitRequest {
    let mut d = descriptor(entries);
    d.hits_addend = hits.map(|value| envoy_types::pb::google::protobuf::UInt64Value { value });
    RateLimitRequest {
        domain: "keep".into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

/// Held request IDs survive a restart too: an in-flight cap's slots stay
/// taken (a release after the restart frees its own), and a budget's
/// reservation settles against what was reserved before a clean stop or a
/// `kill -9`.
#[tokio::test]
async fn held_request_ids_survive_a_restart() {
    const HELD: &str = "domain: keep
descriptors:
  - key: user
    in_flight: {limit: 2, max_hold_seconds: 3600}
  - key: tenant
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 100, algorithm: fixed_window, budget: true, reserve: true}
";
    let (ok, over) = (1, 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let server = serve(HELD, dir.path(), &[]);
    let mut client = server.client().await;
    for id in ["a", "b"] {
        let r = ask(
            &mut client,
            held_call(&[("user", "ann"), ("request_id", id)], None),
        )
        .await;
        assert_eq!(r.overall_code, ok, "take {id}");
    }
    let r = ask(
        &mut client,
        held_call(&[("tenant", "t"), ("request_id", "r1")], Some(60)),
    )
    .await;
    assert_eq!(r.overall_code, ok);
    drop(client);
    stop(server);

    let server = serve(HELD, dir.path(), &[]);
    let mut client = server.client().await;
    let take = |id| held_call(&[("user", "ann"), ("request_id", id)], None);
    assert_eq!(
        ask(&mut client, take("c")).await.overall_code,
        over,
        "both slots held"
    );
    let release = held_call(&[("user", "ann"), ("release", "a")], None);
    assert_eq!(ask(&mut client, release).await.overall_code, ok);
    assert_eq!(
        ask(&mut client, take("c")).await.overall_code,
        ok,
        "a's slot"
    );
    assert_eq!(ask(&mut client, take("d")).await.overall_code, over);
    let settle = held_call(&[("tenant", "t"), ("settle", "r1")], Some(15));
    let r = ask(&mut client, settle).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 85,
        "settled against the reservation"
    );
    let r = ask(
        &mut client,
        held_call(&[("tenant", "t"), ("request_id", "r2")], Some(10)),
    )
    .await;
    assert_eq!(r.overall_code, ok);
    drop(client);
    crash_after_flush(server);

    let server = serve(HELD, dir.path(), &[]);
    let mut client = server.client().await;
    let settle = held_call(&[("tenant", "t"), ("settle", "r2")], Some(0));
    let r = ask(&mut client, settle).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 85,
        "r2's 10 refunded after a kill -9"
    );
    assert_eq!(
        ask(&mut client, take("e")).await.overall_code,
        over,
        "b and c held"
    );
}
