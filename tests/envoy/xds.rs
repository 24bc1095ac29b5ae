//! Rules over xDS against a real `tollgate serve`: an xDS server written
//! from the protocol (tests/common/xds.rs) sends RateLimitConfig snapshots
//! over mutual TLS; Tollgate waits for the first, applies each, ACKs it,
//! NACKs one that does not load (keeping the rules in force), and
//! reconnects to a restarted server with the version it holds.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::envoy::http;
use crate::common::tls::Pki;
use crate::common::xds::{ServerTls, XdsServer};
use crate::common::{Tollgate, ask, eventually, request, rss};
use tollgate::test_util::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};

fn config(name: &str, limit: u32, unit: RateLimitUnit) -> RateLimitConfig {
    RateLimitConfig {
        name: name.into(),
        domain: "t".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: limit,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

fn health(server: &Tollgate) -> (u16, String) {
    let r = http(server.admin, "GET", "/healthcheck", &[]).expect("health");
    (r.status, r.body)
}

async fn remaining(server: &Tollgate, user: &str) -> u32 {
    let mut client = server.client().await;
    ask(&mut client, request("t", &[&[("user", user)]]))
        .await
        .statuses[0]
        .limit_remaining
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_arrive_over_mutual_tls_are_acked_nacked_and_survive_a_server_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let tls = ServerTls {
        cert: pki.pem("server"),
        key: pki.key("server"),
        client_ca: pki.pem("ca"),
    };
    let xds = XdsServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), Some(&tls), None).await;
    let url = format!("https://{}", xds.addr);
    let (ca, cert, key) = (pki.path("ca"), pki.path("client"), pki.key_path("client"));
    let server = Tollgate::start(
        "",
        &[
            "--rules-xds",
            &url,
            "--xds-ca",
            &ca,
            "--xds-client-cert",
            &cert,
            "--xds-client-key",
            &key,
            "--xds-node-id",
            "envoy-ratelimit",
            "--xds-node-metadata",
            "zone=a,team=gw",
            "--xds-header",
            "x-token=s3cret",
            "--xds-connect-retry",
            "200ms",
            "--xds-backoff-initial",
            "200ms",
            "--xds-backoff-max",
            "1s",
        ],
    );
    // Connected, asked for our type with the node, and not ready: no rules yet.
    let first = xds
        .wait_for("a first request", |s| {
            s.type_url.ends_with("RateLimitConfig")
        })
        .await;
    assert_eq!(first.node_id.as_deref(), Some("envoy-ratelimit"));
    let mut metadata = first.node_metadata.clone();
    metadata.sort();
    assert_eq!(
        metadata,
        [("team".into(), "gw".into()), ("zone".into(), "a".into())]
    );
    assert_eq!(first.token.as_deref(), Some("s3cret"));
    assert_eq!(first.version_info, "");
    let (status, body) = health(&server);
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("waiting for the first rules"), "{body}");

    // v1: applied, ACKed with its version and nonce, ready.
    xds.set("v1", vec![config("users", 2, RateLimitUnit::Hour)]);
    let ack = xds
        .wait_for("the ACK of v1", |s| s.version_info == "v1")
        .await;
    assert!(ack.response_nonce.starts_with("nonce-"), "{ack:?}");
    assert_eq!(ack.error, None);
    assert!(
        eventually(Duration::from_secs(10), async || health(&server).0 == 200).await,
        "ready within 10 s"
    );
    let rlconfig = http(server.admin, "GET", "/rlconfig", &[])
        .expect("rlconfig")
        .body;
    assert!(rlconfig.starts_with("# xDS version: v1\n"), "{rlconfig}");
    assert_eq!(remaining(&server, "ann").await, 1);

    // v2: a new limit replaces the old.
    xds.set("v2", vec![config("users", 5, RateLimitUnit::Hour)]);
    xds.wait_for("the ACK of v2", |s| s.version_info == "v2")
        .await;
    assert_eq!(remaining(&server, "bob").await, 4);

    // v3 does not load (a limit without a unit): NACK, v2 stays.
    let errors_before = server.metric("ratelimit_service_config_load_error");
    xds.set("v3", vec![config("users", 9, RateLimitUnit::Unknown)]);
    let nack = xds.wait_for("the NACK of v3", |s| s.error.is_some()).await;
    assert_eq!(
        nack.version_info, "v2",
        "a NACK carries the version in force"
    );
    let error = nack.error.unwrap_or_default();
    assert!(
        error.contains("xds:users") && error.contains("unit"),
        "{error}"
    );
    assert_eq!(
        server.metric("ratelimit_service_config_load_error"),
        errors_before + 1
    );
    assert_eq!(remaining(&server, "carl").await, 4);
    assert_eq!(health(&server).0, 200);

    // The server goes away and comes back on the same address with v4: the
    // new stream opens with the version in force, and v4 is applied.
    let addr = xds.addr;
    let ended = server.log_count("xDS stream for rate limit rules ended");
    drop(xds);
    let t = &server;
    tokio::task::block_in_place(|| {
        crate::common::wait_until(
            "Tollgate to see the stream end",
            Duration::from_secs(10),
            || t.log_count("xDS stream for rate limit rules ended") > ended,
        )
    });
    assert_eq!(
        health(&server).0,
        200,
        "rules in force stay while the server is away"
    );
    let xds = XdsServer::start(
        addr,
        Some(&tls),
        Some(("v4".into(), vec![config("users", 7, RateLimitUnit::Minute)])),
    )
    .await;
    let hello = xds
        .wait_for("a reconnection", |s| s.response_nonce.is_empty())
        .await;
    assert_eq!(hello.version_info, "v2");
    xds.wait_for("the ACK of v4", |s| s.version_info == "v4")
        .await;
    assert_eq!(remaining(&server, "dan").await, 6);
    assert!(server.log_count("xDS stream for rate limit rules ended") >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_waiting_it_is_ready_at_once_and_a_client_without_a_certificate_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let tls = ServerTls {
        cert: pki.pem("server"),
        key: pki.key("server"),
        client_ca: pki.pem("ca"),
    };
    let xds = XdsServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        Some(&tls),
        Some(("v1".into(), vec![config("users", 2, RateLimitUnit::Hour)])),
    )
    .await;
    let url = format!("https://{}", xds.addr);
    let ca = pki.path("ca");
    // No client certificate: the server refuses the handshake, so no rules
    // ever arrive; ready all the same, with none.
    let server = Tollgate::start(
        "",
        &[
            "--rules-xds",
            &url,
            "--xds-ca",
            &ca,
            "--xds-wait-for-rules",
            "off",
            "--xds-connect-retry",
            "100ms",
        ],
    );
    let (status, body) = health(&server);
    assert_eq!(status, 200, "{body}");
    // Refused again and again (retrying every 100 ms), never a stream.
    let t = &server;
    tokio::task::block_in_place(|| {
        crate::common::wait_until("three refused attempts", Duration::from_secs(10), || {
            t.log_count("cannot connect") + t.log_count("stream refused") >= 3
        })
    });
    assert!(xds.seen().is_empty(), "{:?}", xds.seen());
    let mut client = server.client().await;
    let answer = ask(&mut client, request("t", &[&[("user", "ann")]])).await;
    assert!(
        answer.statuses[0].current_limit.is_none(),
        "no rules: no limit"
    );
}

/// An xDS server holding one small rule as `v1`, and a Tollgate that has
/// ACKed it.
async fn serving_v1() -> (XdsServer, Tollgate) {
    let xds = XdsServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        None,
        Some(("v1".into(), vec![config("users", 2, RateLimitUnit::Hour)])),
    )
    .await;
    let url = format!("http://{}", xds.addr);
    let server = Tollgate::start("", &["--rules-xds", &url]);
    xds.wait_for("the ACK of v1", |s| s.version_info == "v1")
        .await;
    (xds, server)
}

/// A large push (7 domains of 17,000 descriptors, about 3.9 MB, within the
/// default --xds-max-message-bytes) is parsed and compiled off the runtime
/// that answers the probes: /healthcheck keeps answering within the
/// kubelet's timeout while it loads.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_push_does_not_delay_the_probes() {
    let (xds, server) = serving_v1().await;
    let big = large_set("cust");
    let bytes: usize = big.iter().map(prost::Message::encoded_len).sum();
    assert!(bytes > 3_500_000 && bytes < 4 << 20, "{bytes} bytes");
    // Probe as the kubelet does, until the push is in force.
    let admin = server.admin;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probing = {
        let done = done.clone();
        tokio::task::spawn_blocking(move || {
            let mut slowest = Duration::ZERO;
            let mut probes = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let started = std::time::Instant::now();
                let r = http(admin, "GET", "/healthcheck", &[]).expect("health answers");
                assert_eq!(r.status, 200, "{}", r.body);
                slowest = slowest.max(started.elapsed());
                probes += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            (slowest, probes)
        })
    };
    xds.set("v2", big);
    // Compiling 119,000 descriptors takes seconds in a debug build, longer
    // with other tests beside it.
    xds.wait_for_within("the ACK of v2", Duration::from_secs(120), |s| {
        s.version_info == "v2"
    })
    .await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (slowest, probes) = probing.await.expect("probing");
    eprintln!("xds: a {bytes}-byte push: /healthcheck at most {slowest:?} over {probes} probes");
    assert!(probes >= 5, "the push took {probes} probes' time");
    // The kubelet's default probe timeout is 1 s. Compiling on the runtime
    // held a probe for the whole compile (seconds); off it, a probe waits only
    // for the two cores the other tests' servers and Envoys share (0.8 ms
    // alone, 155 ms once in a CI run).
    assert!(
        slowest < Duration::from_secs(1),
        "/healthcheck took {slowest:?} during the push ({probes} probes)"
    );
    let mut client = server.client().await;
    let answer = ask(&mut client, request("d6", &[&[("customer", "cust-16999")]])).await;
    assert_eq!(
        answer.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(100 + 16_999 % 900)
    );
}

/// Seven domains of 17,000 descriptors each (3.3-3.7 MB encoded), their values
/// starting with `prefix`.
fn large_set(prefix: &str) -> Vec<RateLimitConfig> {
    (0..7)
        .map(|d| RateLimitConfig {
            name: format!("customers-{d}"),
            domain: format!("d{d}"),
            descriptors: (0..17_000)
                .map(|i| RateLimitDescriptor {
                    key: "customer".into(),
                    value: format!("{prefix}-{i:05}"),
                    rate_limit: Some(RateLimitPolicy {
                        unit: RateLimitUnit::Minute as i32,
                        requests_per_unit: 100 + i % 900,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
        })
        .collect()
}

/// What a large set costs while it is in force, as a factor of its size,
/// and that replaced sets do not pile up: two large sets alternate four
/// times, then one small rule replaces them. (Each replaced set is freed,
/// see `a_replaced_rule_set_is_released`; the allocator keeps the pages for
/// the next set rather than giving them to the system, and how many it keeps
/// varies with the threads that built each set: the first push is the
/// lowest, sometimes half the second. So growth is measured from the second
/// push, when an old set and a new one have both been held once, to the
/// fourth: a pile-up adds a whole set each push.)
#[tokio::test(flavor = "multi_thread")]
async fn a_pushed_set_costs_a_bounded_factor_of_its_size_and_replaced_ones_do_not_pile_up() {
    let (xds, server) = serving_v1().await;
    let pid = server.pid();
    let settled = async |version: &str| {
        xds.wait_for_within(
            &format!("the ACK of {version}"),
            Duration::from_secs(120),
            |s| s.version_info == version,
        )
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss(pid)
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let small = rss(pid);
    let bytes = large_set("a")
        .iter()
        .map(prost::Message::encoded_len)
        .sum::<usize>() as u64;
    let mut held = Vec::new();
    for (n, prefix) in ["a", "b", "a", "b"].iter().enumerate() {
        let version = format!("v{}", n + 2);
        xds.set(&version, large_set(prefix));
        held.push(settled(&version).await);
    }
    xds.set("v9", vec![config("users", 2, RateLimitUnit::Hour)]);
    let back = settled("v9").await;
    let mb = |b: u64| b / 1_000_000;
    let above = |b: u64| b.saturating_sub(small);
    let most = held.iter().map(|&b| above(b)).max().unwrap_or(0);
    eprintln!(
        "xds memory: a {bytes}-byte set; RSS {} MB with one rule, {:?} MB with large sets alternating (at most {}x the set), {} MB back on one rule",
        mb(small),
        held.iter().map(|&b| mb(b)).collect::<Vec<_>>(),
        most / bytes,
        mb(back)
    );
    assert!(
        most <= 100 * bytes,
        "a set costs {}x its size",
        most / bytes
    );
    let (second, fourth) = (above(held[1]), above(held[3]));
    let first = above(held[0]);
    assert!(
        fourth <= second + first / 2,
        "replaced sets pile up: {} MB after four pushes, {} MB after two, a set {} MB",
        mb(fourth),
        mb(second),
        mb(first)
    );
}

/// The xDS version is the control plane's text: `/rlconfig` shows it escaped,
/// so a newline in it cannot forge rule lines.
#[tokio::test(flavor = "multi_thread")]
async fn rlconfig_escapes_the_xds_version() {
    let xds = XdsServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        None,
        Some((
            "v1\nt.user: 1000000 per second (fixed_window)".into(),
            vec![config("users", 2, RateLimitUnit::Hour)],
        )),
    )
    .await;
    let url = format!("http://{}", xds.addr);
    let server = Tollgate::start("", &["--rules-xds", &url]);
    xds.wait_for("the ACK", |s| s.version_info.starts_with("v1"))
        .await;
    let page = http(server.admin, "GET", "/rlconfig", &[])
        .expect("rlconfig")
        .body;
    let lines: Vec<&str> = page.lines().collect();
    assert_eq!(lines.len(), 2, "{page}");
    assert_eq!(
        lines[0],
        "# xDS version: v1\\nt.user: 1000000 per second (fixed_window)"
    );
    assert!(lines[1].starts_with("t.user: 2 per hour"), "{page}");
}

/// A push of 20,000 bad descriptors is refused with a bounded NACK (the
/// first errors and how many more: a few KB, far under a control plane's own
/// receive limit), and a control plane that re-sends it gets one log line,
/// not one per NACK.
#[tokio::test(flavor = "multi_thread")]
async fn a_nack_is_bounded_and_an_identical_one_is_logged_once() {
    let bad = |version: &str| {
        let descriptors = (0..20_000)
            .map(|i| RateLimitDescriptor {
                key: String::new(),
                value: format!("v{i}"),
                ..Default::default()
            })
            .collect();
        (
            version.to_string(),
            vec![RateLimitConfig {
                name: "bad".into(),
                domain: "t".into(),
                descriptors,
            }],
        )
    };
    let (xds, server) = serving_v1().await;
    for version in ["v2", "v3", "v4"] {
        let (v, configs) = bad(version);
        xds.set(&v, configs);
        let nonce_count = xds.seen().len();
        let nack = xds
            .wait_for("a NACK", |s| s.error.is_some() && s.version_info == "v1")
            .await;
        let message = nack.error.expect("an error");
        assert!(message.len() <= 8 * 1024, "{} bytes", message.len());
        assert!(
            message.contains("empty key") && message.contains("more errors"),
            "{message}"
        );
        tokio::task::block_in_place(|| {
            crate::common::wait_until("the NACK is sent", Duration::from_secs(10), || {
                xds.seen().len() > nonce_count
            })
        });
    }
    assert_eq!(
        server.log_count("rules from xDS refused (NACK)"),
        1,
        "an identical NACK is logged once per interval"
    );
    assert_eq!(
        remaining(&server, "ann").await,
        1,
        "the rules in force stay"
    );
}

/// A server that accepts the connection and never speaks is given up on
/// within --xds-open-timeout, logged, and tried again (it was waited on
/// forever, silently).
#[tokio::test(flavor = "multi_thread")]
async fn a_silent_control_plane_is_given_up_on_and_retried() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = silent.local_addr().expect("addr");
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let accepted = accepted.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in silent.incoming().take(64).flatten() {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(stream);
            }
        });
    }
    let url = format!("http://{addr}");
    let server = Tollgate::start(
        "",
        &[
            "--rules-xds",
            &url,
            "--xds-wait-for-rules",
            "off",
            "--xds-open-timeout",
            "500ms",
            "--xds-connect-retry",
            "100ms",
        ],
    );
    let t = &server;
    tokio::task::block_in_place(|| {
        crate::common::wait_until("two attempts given up", Duration::from_secs(15), || {
            t.log_count("no answer within 500ms (--xds-open-timeout)") >= 2
        })
    });
    assert!(accepted.load(std::sync::atomic::Ordering::SeqCst) >= 2);
}

/// A TCP path that can freeze: bytes stop flowing both ways, the sockets
/// stay open (a network partition, not a closed connection).
struct Freezable {
    addr: SocketAddr,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Freezable {
    async fn start(upstream: SocketAddr) -> Freezable {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let frozen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gate = frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (mut from, mut to, gate) in [
                    (
                        Box::new(cr) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                        Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                        gate.clone(),
                    ),
                    (Box::new(sr) as _, Box::new(cw) as _, gate.clone()),
                ] {
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match from.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            // Frozen: what was read is never delivered.
                            while gate.load(std::sync::atomic::Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            if to.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Freezable { addr, frozen }
    }

    fn freeze(&self, on: bool) {
        self.frozen.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

/// When the path to the control plane freezes, the keepalive PING goes
/// unanswered, the connection is dropped and logged, and a new one brings
/// the rules pushed meanwhile (the rules stayed stale, silently, forever).
#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_path_to_the_control_plane_is_noticed_and_left() {
    let xds = XdsServer::start(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        None,
        Some(("v1".into(), vec![config("users", 2, RateLimitUnit::Hour)])),
    )
    .await;
    let path = Freezable::start(xds.addr).await;
    let url = format!("http://{}", path.addr);
    let server = Tollgate::start(
        "",
        &[
            "--rules-xds",
            &url,
            "--xds-keepalive",
            "200ms",
            "--xds-keepalive-timeout",
            "300ms",
            "--xds-connect-retry",
            "100ms",
            "--xds-backoff-initial",
            "100ms",
        ],
    );
    xds.wait_for("the ACK of v1", |s| s.version_info == "v1")
        .await;
    path.freeze(true);
    let t = &server;
    tokio::task::block_in_place(|| {
        crate::common::wait_until("the frozen stream is left", Duration::from_secs(10), || {
            t.log_count("xDS stream for rate limit rules ended") >= 1
        })
    });
    xds.set("v2", vec![config("users", 7, RateLimitUnit::Hour)]);
    path.freeze(false);
    xds.wait_for("the ACK of v2", |s| s.version_info == "v2")
        .await;
    assert_eq!(remaining(&server, "eve").await, 6);
}
