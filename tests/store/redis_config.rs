//! Redis as the reference's users configure it, and configuration mistakes
//! that must be loud: mutual TLS and AUTH from the reference's variables
//! (Envoy Gateway's redis-tls-settings Deployment); a wrong or missing
//! password, a missing client certificate and a closed port each reported
//! as what they are, and the first two failing readiness.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::envoy::http;
use crate::common::redis::free_port;
use crate::common::tls::Pki;
use crate::common::{Tollgate, ask, holds_within, request};

const RULES: &str =
    "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

/// A redis-server, killed on drop.
struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis(port: u16, args: &[&str], dir: &std::path::Path) -> Redis {
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--save", ""])
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is needed by this test (Debian: apt-get install redis-server)");
    crate::common::wait_until("redis-server started", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Redis(child)
}

fn tls_redis(pki: &Pki, port: u16, dir: &std::path::Path) -> Redis {
    let (cert, key, ca) = (pki.path("server"), pki.key_path("server"), pki.path("ca"));
    let port = port.to_string();
    redis(
        port.parse().expect("port"),
        &[
            "--port",
            "0",
            "--tls-port",
            &port,
            "--tls-auth-clients",
            "yes",
            "--requirepass",
            "s3cr@t#pw",
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
        ],
        dir,
    )
}

fn health(server: &Tollgate) -> (u16, String) {
    let r = http(server.admin, "GET", "/healthcheck", &[]).expect("health");
    (r.status, r.body)
}

/// Waits (2 s at most) until a stderr line contains `needle`: lines are
/// read on a thread of their own, after the server says it listens.
fn logged(server: &Tollgate, needle: &str) -> bool {
    holds_within(Duration::from_secs(2), || server.log_count(needle) > 0)
}

fn logs(server: &Tollgate) -> String {
    server.stderr.lock().map(|s| s.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_and_auth_from_the_references_variables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let port = free_port();
    let _redis = tls_redis(&pki, port, dir.path());
    let url = format!("127.0.0.1:{port}");
    let (ca, cert, key) = (pki.path("ca"), pki.path("client"), pki.key_path("client"));
    let server = Tollgate::start_with_env(
        RULES,
        &["--redis-timeout", "2s"],
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &url),
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "s3cr@t#pw"),
            ("REDIS_TLS_CACERT", &ca),
            ("REDIS_TLS_CLIENT_CERT", &cert),
            ("REDIS_TLS_CLIENT_KEY", &key),
        ],
    );
    let mut client = server.client().await;
    let codes = [
        ask(&mut client, request("t", &[&[("user", "ann")]]))
            .await
            .overall_code,
        ask(&mut client, request("t", &[&[("user", "ann")]]))
            .await
            .overall_code,
    ];
    assert_eq!(
        codes,
        [1, 2],
        "OK then OVER_LIMIT, decided by Redis: {}",
        logs(&server)
    );
    assert_eq!(health(&server).0, 200);
    assert!(logged(&server, "Redis answers"), "{}", logs(&server));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_client_certificate_is_a_tls_error_and_not_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let port = free_port();
    let _redis = tls_redis(&pki, port, dir.path());
    let url = format!("127.0.0.1:{port}");
    let ca = pki.path("ca");
    let server = Tollgate::start_with_env(
        RULES,
        &["--redis-timeout", "2s"],
        &[
            ("REDIS_URL", &url),
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "s3cr@t#pw"),
            ("REDIS_TLS_CACERT", &ca),
        ],
    );
    let (status, body) = health(&server);
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("TLS handshake with Redis failed"), "{body}");
    assert!(
        logged(&server, "Redis refuses this configuration"),
        "{}",
        logs(&server)
    );
    assert_eq!(server.log_count("Redis answers"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_or_missing_password_a_closed_port_and_an_unknown_host_say_what_they_are() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let _redis = redis(
        port,
        &["--port", &port.to_string(), "--requirepass", "right"],
        dir.path(),
    );
    for url in [
        format!("redis://:wrong@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        let server = Tollgate::start(
            RULES,
            &[
                "--store",
                "redis",
                "--redis-url",
                &url,
                "--redis-timeout",
                "2s",
            ],
        );
        let (status, body) = health(&server);
        assert_eq!(status, 500, "{url}: {body}");
        assert!(body.contains("refused the credentials"), "{url}: {body}");
        assert!(
            !logs(&server).contains("wrong"),
            "the password is never logged"
        );
        // Requests are answered from the failure modes meanwhile.
        let mut client = server.client().await;
        let answer = ask(&mut client, request("t", &[&[("user", "ann")]])).await;
        assert_eq!(answer.overall_code, 1);
    }
    let closed = free_port();
    let url = format!("redis://127.0.0.1:{closed}");
    let server = Tollgate::start(
        RULES,
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-timeout",
            "2s",
        ],
    );
    assert!(logged(&server, "Connection refused"), "{}", logs(&server));
    assert_eq!(
        server.log_count("did not answer within"),
        0,
        "{}",
        logs(&server)
    );
    // An outage, not a mistake: ready, degraded.
    let (status, body) = health(&server);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("degraded"), "{body}");
    // A name that does not resolve says so (`.invalid` never resolves).
    let server = Tollgate::start(
        RULES,
        &[
            "--store",
            "redis",
            "--redis-url",
            "redis://no-such-redis.invalid:6379",
            "--redis-timeout",
            "2s",
        ],
    );
    assert!(
        logged(&server, "lookup") || logged(&server, "resolve"),
        "{}",
        logs(&server)
    );
    assert_eq!(
        server.log_count("did not answer within"),
        0,
        "{}",
        logs(&server)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_unix_socket_from_the_references_variables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("redis.sock");
    let socket_s = socket.to_str().expect("utf-8").to_owned();
    let child = Command::new("redis-server")
        .args(["--port", "0", "--unixsocket", &socket_s, "--save", ""])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is needed by this test (Debian: apt-get install redis-server)");
    let _redis = Redis(child);
    crate::common::wait_until("redis-server started", Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
    let server = Tollgate::start_with_env(
        RULES,
        &["--redis-timeout", "2s"],
        &[("REDIS_SOCKET_TYPE", "unix"), ("REDIS_URL", &socket_s)],
    );
    let mut client = server.client().await;
    let codes = [
        ask(&mut client, request("t", &[&[("user", "ann")]]))
            .await
            .overall_code,
        ask(&mut client, request("t", &[&[("user", "ann")]]))
            .await
            .overall_code,
    ];
    assert_eq!(
        codes,
        [1, 2],
        "decided by Redis over its socket: {}",
        logs(&server)
    );
    assert!(logged(&server, "Redis answers"), "{}", logs(&server));
}

/// Sleeps until 50 ms past the next whole second of the wall clock, so a
/// few quick requests fall in one one-second window.
fn start_of_a_second() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock");
    let into = now.subsec_millis() as u64;
    std::thread::sleep(Duration::from_millis(1000 - into + 50));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_per_second_pool_holds_limits_of_a_second_and_a_refusal_spends_nothing_on_either() {
    let main = crate::common::redis::RedisServer::start();
    let seconds = crate::common::redis::RedisServer::start();
    let rules = "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: burst\n    rate_limit: {unit: second, requests_per_unit: 2, algorithm: fixed_window}\n";
    let (main_url, seconds_url) = (
        format!("127.0.0.1:{}", main.port),
        format!("127.0.0.1:{}", seconds.port),
    );
    let server = Tollgate::start_with_env(
        rules,
        &["--redis-timeout", "2s"],
        &[
            ("REDIS_URL", &main_url),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", &seconds_url),
        ],
    );
    let mut client = server.client().await;
    assert_eq!(
        ask(&mut client, request("t", &[&[("user", "ann")]]))
            .await
            .overall_code,
        1
    );
    assert_eq!(
        ask(&mut client, request("t", &[&[("burst", "x")]]))
            .await
            .overall_code,
        1
    );
    let (on_main, on_seconds) = (main.cli(&["--scan"]), seconds.cli(&["--scan"]));
    assert!(
        on_main.contains("user=ann") && !on_main.contains("burst"),
        "{on_main}"
    );
    assert!(
        on_seconds.contains("burst=x") && !on_seconds.contains("user"),
        "{on_seconds}"
    );

    // In one second: y's 2 hits, then a request on bob (main) and y
    // (per-second pool) is refused by y, and bob is not charged.
    start_of_a_second();
    for _ in 0..2 {
        assert_eq!(
            ask(&mut client, request("t", &[&[("burst", "y")]]))
                .await
                .overall_code,
            1
        );
    }
    let both = ask(
        &mut client,
        request("t", &[&[("user", "bob")], &[("burst", "y")]]),
    )
    .await;
    assert_eq!(both.overall_code, 2, "{both:?}");
    let bob = ask(&mut client, request("t", &[&[("user", "bob")]])).await;
    assert_eq!(
        bob.statuses[0].limit_remaining, 99,
        "the refused request spent nothing on the main Redis"
    );
}
