//! The binary run as envoyproxy/ratelimit's `/bin/ratelimit` (what Envoy
//! Gateway's Deployment runs): no arguments, the reference's defaults and
//! variables, and none of them silently ignored.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use crate::common::envoy::http;
use crate::common::redis::free_port;
use crate::common::tls::{Pki, client_config, tls_call};
use crate::common::{Tollgate, holds_within, request};

const RULES: &str = "domain: t
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
";

/// Runs the binary as `ratelimit` with `args` and `env` until it exits
/// (within 20 s); its status and stderr.
fn run_as_reference(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let program = dir.path().join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), &program).expect("link");
    let mut child = Command::new(&program)
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    if !holds_within(Duration::from_secs(20), || {
        child.try_wait().expect("wait").is_some()
    }) {
        let _ = child.kill();
        panic!("ratelimit {args:?} kept running");
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn ratelimit_with_no_arguments_serves_as_configured_by_the_references_variables() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    // RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
    let rules = dir.path().join("runtime/ratelimit/limits");
    std::fs::create_dir_all(&rules).expect("mkdir");
    std::fs::write(rules.join("t.yaml"), RULES).expect("rules");
    let (grpc, port, debug) = (free_port(), free_port(), free_port());
    let root = dir.path().join("runtime");
    let (grpc_s, port_s, debug_s) = (grpc.to_string(), port.to_string(), debug.to_string());
    let (cert, key, ca) = (pki.path("server"), pki.key_path("server"), pki.path("ca"));
    let server = Tollgate::start_as_reference(&[
        ("RUNTIME_ROOT", root.to_str().expect("utf-8")),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_APPDIRECTORY", "limits"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", &grpc_s),
        ("HOST", "127.0.0.1"),
        ("PORT", &port_s),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", &debug_s),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &cert),
        ("GRPC_SERVER_TLS_KEY", &key),
        // Envoy Gateway sets it; the reference does not read it.
        ("GRPC_SERVER_TLS_CA_CERT", &ca),
        ("REDIS_POOL_SIZE", "10"),
    ]);
    assert_eq!(server.addr.port(), grpc);
    // gRPC over TLS only; the reference's HTTP ports stay plain for the
    // kubelet's httpGet probes.
    let answer = tls_call(server.addr, client_config(&pki, "ca", None))
        .await
        .expect("served over TLS, no client certificate needed");
    assert_eq!(answer.statuses[0].limit_remaining, 1);
    // The reference's default: no rate limit headers.
    assert!(answer.response_headers_to_add.is_empty(), "{answer:?}");
    let plain = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .expect("uri")
        .connect()
        .await;
    if let Ok(channel) = plain {
        let mut client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(channel);
        assert!(
            client
                .should_rate_limit(request("t", &[&[("user", "ann")]]))
                .await
                .is_err(),
            "no plaintext gRPC"
        );
    }
    for admin in [port, debug] {
        let r = http(
            SocketAddr::from(([127, 0, 0, 1], admin)),
            "GET",
            "/healthcheck",
            &[],
        )
        .expect("plain HTTP health");
        assert_eq!(r.status, 200, "{r:?}");
    }
}

#[test]
fn every_setting_it_cannot_honour_is_refused_by_name() {
    let (grpc, port, debug) = (
        free_port().to_string(),
        free_port().to_string(),
        free_port().to_string(),
    );
    let (ok, stderr) = run_as_reference(
        &[],
        &[
            ("GRPC_PORT", &grpc),
            ("PORT", &port),
            ("DEBUG_PORT", &debug),
            ("GRPC_UDS", "/tmp/ratelimit.sock"),
            ("LIMIT_LIMIT_HEADER", "X-Limit"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
            // Harmless values of refusable variables pass.
            ("PROTO", "tcp"),
            ("GRPC_MAX_CONNECTION_AGE", "24h"),
        ],
    );
    assert!(!ok);
    for name in [
        "GRPC_UDS=/tmp/ratelimit.sock",
        "LIMIT_LIMIT_HEADER=X-Limit",
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true",
    ] {
        assert!(stderr.contains(name), "{name}: {stderr}");
    }
    assert!(!stderr.contains("PROTO"), "{stderr}");
    assert!(!stderr.contains("GRPC_MAX_CONNECTION_AGE"), "{stderr}");

    // TLS files without GRPC_SERVER_USE_TLS would leave a plaintext server.
    let (ok, stderr) = run_as_reference(
        &[],
        &[
            ("GRPC_PORT", &grpc),
            ("PORT", &port),
            ("DEBUG_PORT", &debug),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ],
    );
    assert!(!ok);
    assert!(stderr.contains("GRPC_SERVER_USE_TLS"), "{stderr}");

    // A Unix socket cannot carry TLS: refused, not TLS silently dropped.
    let (ok, stderr) = run_as_reference(
        &[],
        &[
            ("GRPC_PORT", &grpc),
            ("PORT", &port),
            ("DEBUG_PORT", &debug),
            ("REDIS_URL", "127.0.0.1:6379"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", "/tmp/persecond.sock"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "unix"),
            ("REDIS_PERSECOND_TLS", "true"),
        ],
    );
    assert!(!ok);
    assert!(
        stderr.contains("REDIS_PERSECOND_SOCKET_TYPE=unix")
            && stderr.contains("REDIS_PERSECOND_TLS"),
        "{stderr}"
    );

    // The reference's binary takes no arguments.
    let (ok, stderr) = run_as_reference(&["serve"], &[]);
    assert!(!ok);
    assert!(stderr.contains("takes no arguments"), "{stderr}");
}

#[tokio::test]
async fn tollgate_serve_takes_grpc_tls_from_the_references_variables_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let (cert, key, ca) = (pki.path("server"), pki.key_path("server"), pki.path("ca"));
    let server = Tollgate::start_with_env(
        RULES,
        &[],
        &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &cert),
            ("GRPC_SERVER_TLS_KEY", &key),
            ("GRPC_CLIENT_TLS_CACERT", &ca),
            // The client certificate's SAN is DNS:envoy.
            ("GRPC_CLIENT_TLS_SAN", "envoy"),
        ],
    );
    let ok = tls_call(server.addr, client_config(&pki, "ca", Some("client")))
        .await
        .expect("mutual TLS");
    assert_eq!(ok.statuses[0].limit_remaining, 1);
    assert!(
        tls_call(server.addr, client_config(&pki, "ca", None))
            .await
            .is_err(),
        "GRPC_CLIENT_TLS_CACERT requires a client certificate"
    );
    // A certificate from the right CA without the SAN is refused.
    let strict = Tollgate::start_with_env(
        RULES,
        &[],
        &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", &cert),
            ("GRPC_SERVER_TLS_KEY", &key),
            ("GRPC_CLIENT_TLS_CACERT", &ca),
            ("GRPC_CLIENT_TLS_SAN", "istio-ingressgateway"),
        ],
    );
    assert!(
        tls_call(strict.addr, client_config(&pki, "ca", Some("client")))
            .await
            .is_err(),
        "a client certificate without the SAN is refused"
    );
}
