//! Redis behind a real `redis-sentinel` (a master, a replica, one sentinel),
//! configured as the reference's users do (`REDIS_TYPE=sentinel`,
//! `REDIS_URL=<master name>,<sentinel>`): exact decisions before, and
//! after `SENTINEL FAILOVER` requests decided on the new master within
//! seconds, with the counters the replica had.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::redis::{RedisServer, free_port};
use crate::common::{Tollgate, ask, request, wait_until};

const RULES: &str =
    "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli is needed by this test (Debian: apt-get install redis-tools)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn decisions_follow_a_sentinel_failover_to_the_new_master() {
    let master = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let replica_port = free_port();
    let _replica = Killed(
        Command::new("redis-server")
            .args([
                "--port",
                &replica_port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--replicaof", "127.0.0.1", &master.port.to_string()])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server"),
    );
    wait_until("the replica in sync", Duration::from_secs(10), || {
        cli(replica_port, &["INFO", "replication"]).contains("master_link_status:up")
    });
    let sentinel_port = free_port();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {sentinel_port}\nbind 127.0.0.1\ndir {}\n\
             sentinel monitor mymaster 127.0.0.1 {} 1\n\
             sentinel down-after-milliseconds mymaster 1000\n\
             sentinel failover-timeout mymaster 5000\n",
            dir.path().display(),
            master.port
        ),
    )
    .expect("sentinel.conf");
    let _sentinel = Killed(
        Command::new("redis-sentinel")
            .arg(&conf)
            .stdout(Stdio::null())
            .spawn()
            .expect(
                "redis-sentinel is needed by this test (Debian: apt-get install redis-sentinel)",
            ),
    );
    wait_until(
        "the sentinel to know the replica",
        Duration::from_secs(20),
        || {
            cli(sentinel_port, &["SENTINEL", "replicas", "mymaster"])
                .contains(&replica_port.to_string())
        },
    );

    let url = format!("mymaster,127.0.0.1:{sentinel_port}");
    let server = Tollgate::start_with_env(
        RULES,
        &["--redis-timeout", "500ms"],
        &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", &url)],
    );
    let mut client = server.client().await;
    let mut remaining = Vec::new();
    for _ in 0..3 {
        let r = ask(&mut client, request("t", &[&[("user", "ann")]])).await;
        remaining.push(r.statuses[0].limit_remaining);
    }
    assert_eq!(remaining, [4, 3, 2], "exact on the first master");
    assert!(
        !master.cli(&["--scan"]).trim().is_empty(),
        "counters on the master"
    );
    // The replica has every write before the failover. (WAIT from another
    // connection would not do: it waits for that connection's writes only,
    // none, and answered at once while the replica was still at offset 0.)
    let written = master.cli(&["--scan"]);
    wait_until(
        "the replica to have every write",
        Duration::from_secs(10),
        || {
            let copied = cli(replica_port, &["--scan"]);
            // Counters; call receipts live a second and may be gone already.
            written
                .lines()
                .filter(|key| !key.contains(":call:"))
                .all(|key| copied.lines().any(|k| k == key))
        },
    );

    // The sentinel answers NOGOODSLAVE until it has seen the replica
    // healthy for a while: ask until it accepts.
    wait_until(
        "the sentinel to start a failover",
        Duration::from_secs(30),
        || cli(sentinel_port, &["SENTINEL", "FAILOVER", "mymaster"]).trim() == "OK",
    );
    let started = Instant::now();
    wait_until(
        "the sentinel to name the new master",
        Duration::from_secs(20),
        || {
            cli(
                sentinel_port,
                &["SENTINEL", "get-master-addr-by-name", "mymaster"],
            )
            .contains(&replica_port.to_string())
        },
    );
    // Requests are decided on the new master within seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut probe = 0;
    loop {
        probe += 1;
        let user = format!("probe{probe}");
        ask(&mut client, request("t", &[&[("user", &user)]])).await;
        if cli(replica_port, &["--scan"]).contains(&user) {
            break;
        }
        if Instant::now() >= deadline {
            let metrics = crate::common::envoy::http(server.admin, "GET", "/metrics", &[])
                .map(|r| r.body)
                .unwrap_or_default();
            let interesting: Vec<&str> = metrics
                .lines()
                .filter(|l| l.starts_with("tollgate_store") || l.starts_with("tollgate_failure"))
                .collect();
            panic!(
                "no decision on the new master 10 s after the failover\nold master: {}\nnew: {}\nold keys: {}\n{interesting:#?}",
                master
                    .cli(&["INFO", "replication"])
                    .lines()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" "),
                cli(replica_port, &["INFO", "replication"])
                    .lines()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" "),
                master.cli(&["--scan"]),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recovered = started.elapsed();
    eprintln!("decided on the new master {recovered:?} after SENTINEL FAILOVER");
    // Exact again, with the counters the replica had.
    let mut after = Vec::new();
    for _ in 0..3 {
        let r = ask(&mut client, request("t", &[&[("user", "ann")]])).await;
        after.push((r.overall_code, r.statuses[0].limit_remaining));
    }
    assert_eq!(
        after,
        [(1, 1), (1, 0), (2, 0)],
        "ann's count carried over to the new master"
    );
}
