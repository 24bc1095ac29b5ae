//! A data directory's faults, each met with a clear error and nothing lost
//! silently: a damaged or cut file and a file of another data format are
//! refused (naming the file and --data-reset), --data-dir on a file, on a
//! directory that cannot be written, beside a Redis store, or in use by
//! another process is refused by name; a full disk keeps decisions going
//! from memory, says so (log, health, metric), and writes again once there
//! is room.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::durable::{SHAPES, serve, stop};
use crate::common::envoy::http;
use crate::common::{ask, descriptor, run_briefly, wait_until};

const FILE: &str = "counters.redb";

fn data_args(dir: &Path) -> Vec<String> {
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, SHAPES).expect("rules");
    vec![
        "--rules".into(),
        rules.display().to_string(),
        "--data-dir".into(),
        dir.join("data").display().to_string(),
    ]
}

fn refused(args: &[String], naming: &[&str]) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_briefly(&args, &[]).assert_refused(naming);
}

/// A data directory with counters in it, its server stopped.
async fn written(dir: &Path) {
    let server = serve(SHAPES, &dir.join("data"), &[]);
    let mut client = server.client().await;
    for i in 0..500 {
        let r = RateLimitRequest {
            domain: "keep".into(),
            descriptors: vec![descriptor(&[("fixed", &format!("u{i}"))])],
            hits_addend: 1,
        };
        ask(&mut client, r).await;
    }
    drop(client);
    stop(server);
}

#[tokio::test]
async fn a_damaged_file_is_refused_until_reset() {
    let dir = tempfile::tempdir().expect("tempdir");
    written(dir.path()).await;
    let file = dir.path().join("data").join(FILE);
    let mut bytes = std::fs::read(&file).expect("the file");
    let len = bytes.len();
    for b in &mut bytes[len / 8..len - len / 8] {
        *b = 0x5a;
    }
    std::fs::write(&file, &bytes).expect("garbage written");
    let args = data_args(dir.path());
    refused(&args, &[FILE, "--data-reset"]);
    let mut reset = args.clone();
    reset.push("--data-reset".into());
    let run = run_briefly(&reset.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    assert!(run.started && run.success, "{}", run.stderr);
    assert!(run.stderr.contains("--data-reset"), "said: {}", run.stderr);
    let run = run_briefly(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    assert!(run.started && run.success, "a fresh file: {}", run.stderr);
}

#[tokio::test]
async fn a_cut_file_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    written(dir.path()).await;
    let file = dir.path().join("data").join(FILE);
    let len = std::fs::metadata(&file).expect("the file").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .and_then(|f| f.set_len(len / 2))
        .expect("cut");
    refused(&data_args(dir.path()), &[FILE, "--data-reset"]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .and_then(|f| f.set_len(0))
        .expect("emptied");
    refused(&data_args(dir.path()), &[FILE, "--data-reset"]);
}

#[tokio::test]
async fn another_data_format_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    written(dir.path()).await;
    let db = redb::Database::open(dir.path().join("data").join(FILE)).expect("opens");
    let txn = db.begin_write().expect("txn");
    {
        let meta: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("meta");
        txn.open_table(meta)
            .expect("meta")
            .insert("format", 99)
            .expect("set");
    }
    txn.commit().expect("commit");
    drop(db);
    refused(
        &data_args(dir.path()),
        &[FILE, "data format 99", "--data-reset"],
    );
}

#[test]
fn a_file_a_read_only_directory_and_redis_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = data_args(dir.path());
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").expect("file");
    args[3] = file.display().to_string();
    refused(&args, &["--data-dir", "not a directory"]);

    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).expect("dir");
    mount(&ro, "ro,size=1m");
    args[3] = ro.display().to_string();
    let run = run_briefly(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    umount(&ro);
    run.assert_refused(&["--data-dir", "cannot write"]);

    let mut redis = data_args(dir.path());
    redis.extend(["--store".into(), "redis".into()]);
    refused(&redis, &["--data-dir", "--store memory"]);
}

#[test]
fn a_second_process_on_one_directory_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = serve(SHAPES, &dir.path().join("data"), &[]);
    refused(
        &data_args(dir.path()),
        &["--data-dir", "in use", &format!("pid {}", first.pid())],
    );
    stop(first);
}

fn mount(dir: &Path, options: &str) {
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", options, "tmpfs"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "this test mounts a tmpfs: run it as root");
}

fn umount(dir: &Path) {
    let _ = Command::new("umount").arg(dir).status();
}

/// Unmounts when the test ends, however it ends.
struct Mounted<'a>(&'a Path);

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        umount(self.0);
    }
}

#[tokio::test]
async fn a_full_disk_keeps_deciding_says_so_and_writes_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("dir");
    mount(&data, "size=8m");
    let _mounted = Mounted(&data);
    let args = ["--data-flush-interval", "100ms"];
    let server = serve(SHAPES, &data, &args);
    // Fill the disk.
    let filler = data.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=64k"])
        .arg(format!("of={}", filler.display()))
        .output();
    let mut client = server.client().await;
    let mut remaining = Vec::new();
    for i in 0..20_000 {
        let r = RateLimitRequest {
            domain: "keep".into(),
            descriptors: vec![descriptor(&[("fixed", &format!("u{}", i % 2000))])],
            hits_addend: 1,
        };
        remaining.push(ask(&mut client, r).await.statuses[0].limit_remaining);
    }
    assert_eq!(remaining.last(), Some(&(1000 - 10)), "decisions went on");
    wait_until("the writes fail", Duration::from_secs(10), || {
        server.metric("tollgate_data_write_failing") == 1
    });
    let health = http(server.admin, "GET", "/healthcheck", &[]).expect("health");
    assert_eq!(health.status, 200, "still ready: {}", health.body);
    assert!(
        health.body.contains("data directory not written"),
        "{}",
        health.body
    );
    assert_eq!(
        server.log_count("cannot write the data directory"),
        1,
        "said once"
    );
    std::fs::remove_file(&filler).expect("room again");
    wait_until("writes again", Duration::from_secs(10), || {
        server.metric("tollgate_data_write_failing") == 0
    });
    assert_eq!(server.log_count("the data directory is written again"), 1);
    drop(client);
    stop(server);
    let server = serve(SHAPES, &data, &args);
    let mut client = server.client().await;
    let r = RateLimitRequest {
        domain: "keep".into(),
        descriptors: vec![descriptor(&[("fixed", "u1999")])],
        hits_addend: 1,
    };
    assert_eq!(
        ask(&mut client, r).await.statuses[0].limit_remaining,
        1000 - 11
    );
    drop(client);
    stop(server);
}
