//! TLS and mutual TLS on the gRPC and admin listeners, with certificates
//! made by `openssl`, and a renewed certificate picked up without a restart.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::common::tls::{Pki, client_config, tls_call};
use crate::common::{Tollgate, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const RULES: &str = "domain: t
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
";

/// `curl` against the admin port over TLS; the HTTP status, or 0 when the
/// TLS handshake failed.
fn curl(admin: SocketAddr, ca: &Path, client: Option<(&Path, &Path)>) -> u16 {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "5",
        "--cacert",
    ])
    .arg(ca);
    if let Some((cert, key)) = client {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    let out = cmd
        .arg(format!("https://127.0.0.1:{}/healthcheck", admin.port()))
        .output()
        .expect("curl is needed by this test (Debian: apt-get install curl)");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[tokio::test]
async fn mutual_tls_on_grpc_and_admin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let server = Tollgate::start(RULES, &pki.mutual_tls_args().each_ref().map(String::as_str));
    let ok = tls_call(server.addr, client_config(&pki, "ca", Some("client")))
        .await
        .expect("a client with a certificate is served");
    assert_eq!(ok.overall_code, Code::Ok as i32);
    assert_eq!(ok.statuses[0].limit_remaining, 1);
    assert!(
        tls_call(server.addr, client_config(&pki, "ca", None))
            .await
            .is_err(),
        "a client without a certificate is refused"
    );
    // A stranger's certificate is refused too.
    pki.ca("other");
    pki.issue("other", "stranger", "extendedKeyUsage=clientAuth");
    assert!(
        tls_call(server.addr, client_config(&pki, "ca", Some("stranger")))
            .await
            .is_err()
    );
    // Plaintext gRPC is not served.
    let mut plain = server.client().await;
    assert!(
        plain
            .should_rate_limit(request("t", &[&[("user", "x")]]))
            .await
            .is_err()
    );

    let with_cert = Some((pki.pem("client"), pki.key("client")));
    let with_cert = with_cert.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    assert_eq!(curl(server.admin, &pki.pem("ca"), with_cert), 200);
    assert_eq!(
        curl(server.admin, &pki.pem("ca"), None),
        0,
        "admin needs a client certificate too"
    );
}

#[tokio::test]
async fn a_renewed_certificate_is_used_without_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let (cert, key) = (dir.path().join("live.pem"), dir.path().join("live.key"));
    std::fs::copy(pki.pem("server"), &cert).expect("copy");
    std::fs::copy(pki.key("server"), &key).expect("copy");
    let server = Tollgate::start(
        RULES,
        &[
            "--tls-cert",
            &cert.display().to_string(),
            "--tls-key",
            &key.display().to_string(),
        ],
    );
    assert_eq!(curl(server.admin, &pki.pem("ca"), None), 200);
    // Renewal by a new CA; clients that trust only the new CA fail until
    // the server has picked the new certificate up.
    pki.ca("ca2");
    pki.issue(
        "ca2",
        "renewed",
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth",
    );
    assert_eq!(curl(server.admin, &pki.pem("ca2"), None), 0);
    // A half-written key is not loaded: the certificate in force stays.
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nnot a key\n").expect("write");
    crate::common::wait_until("the bad key looked at", Duration::from_secs(10), || {
        server.log_count("TLS files not reloaded") > 0
    });
    assert_eq!(
        curl(server.admin, &pki.pem("ca"), None),
        200,
        "the old certificate still serves"
    );
    std::fs::copy(pki.key("renewed"), &key).expect("copy");
    std::fs::copy(pki.pem("renewed"), &cert).expect("copy");
    crate::common::wait_until(
        "the renewed certificate picked up",
        Duration::from_secs(10),
        || curl(server.admin, &pki.pem("ca2"), None) == 200,
    );
    let served = tls_call(server.addr, client_config(&pki, "ca2", None))
        .await
        .expect("gRPC serves the renewed certificate");
    assert_eq!(served.overall_code, Code::Ok as i32);
    assert!(server.log_count("TLS certificate reloaded") >= 1);
}

#[test]
fn bad_tls_files_stop_start_up_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(dir.path());
    let run = crate::common::run_briefly(
        &[
            "--tls-cert",
            &pki.path("server"),
            "--tls-key",
            &pki.key_path("client"),
        ],
        &[],
    );
    run.assert_refused(&["server.pem", "client.key"]);
}
