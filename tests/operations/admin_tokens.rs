//! The admin port's tokens (`--admin-token-file`): rotated without a
//! restart (the file watched, and SIGHUP), closed loudly when the file goes
//! or is opened to others, parsed strictly, read-only ones, failed
//! attempts counted, logged and throttled, the caller in the reset's audit
//! line; with reads closed, every endpoint that shows a client's counters
//! needs a token; a request without a Host is refused; `tollgate top` over
//! TLS, with what it prints escaped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::common::envoy::{Response, http, http_with_body};
use crate::common::{Served, Tollgate, ask, holds_within, request, token_file};

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
const A: &str = "0123456789abcdefAAAA";
const B: &str = "0123456789abcdefBBBB";
const BODY: &str = r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#;

fn reset(admin: SocketAddr, authorization: &str) -> Response {
    http_with_body(
        admin,
        "POST",
        "/counters/reset",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", authorization),
        ],
        BODY,
    )
    .expect("admin answers")
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Replaces `path`'s content at once (a rename), mode 0600.
fn replace(path: &str, text: &str) {
    let dir = std::path::Path::new(path).parent().expect("a directory");
    let new = token_file(dir, "next", text);
    std::fs::rename(new, path).expect("rename");
}

/// Asks until `done` or `within` passed; how long it took.
fn within(within: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if done() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn a_rotated_token_works_and_the_old_one_stops_within_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = token_file(dir.path(), "tokens", &format!("ops:{A}\n"));
    let server = Tollgate::start(
        RULES,
        &[
            "--admin-token-file",
            &tokens,
            "--admin-auth-max-failures",
            "100000",
        ],
    );
    assert_eq!(reset(server.admin, &bearer(A)).status, 200);
    replace(&tokens, &format!("ops:{B}\n"));
    let took = within(Duration::from_secs(1), || {
        reset(server.admin, &bearer(B)).status == 200
    });
    assert!(took.is_some(), "the new token works within a second");
    assert_eq!(
        reset(server.admin, &bearer(A)).status,
        401,
        "the old one stops"
    );

    // SIGHUP reloads at once (the file is watched too; the log says which).
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    let by_hup = || {
        server
            .stderr
            .lock()
            .expect("stderr")
            .lines()
            .any(|l| l.contains("admin tokens reloaded") && l.contains("SIGHUP"))
    };
    assert!(
        within(Duration::from_secs(2), by_hup).is_some(),
        "{}",
        server.stderr.lock().expect("stderr")
    );
    assert_eq!(reset(server.admin, &bearer(B)).status, 200, "still serving");

    // Deleted: every token refused, loudly, within a second.
    std::fs::remove_file(&tokens).expect("rm");
    assert!(
        within(Duration::from_secs(1), || reset(server.admin, &bearer(B))
            .status
            == 503)
        .is_some()
    );
    let closed = reset(server.admin, &bearer(B));
    assert!(
        closed.body.contains(&tokens) && closed.body.contains("did not load"),
        "{}",
        closed.body
    );
    assert!(server.log_count("admin tokens closed") >= 1);
    // Back, but readable by others: still closed, saying why.
    std::fs::write(&tokens, format!("ops:{B}\n")).expect("write");
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .expect("chmod");
    assert!(
        within(Duration::from_secs(1), || reset(server.admin, &bearer(B))
            .body
            .contains("chmod 600"))
        .is_some()
    );
    // Empty: closed.
    replace(&tokens, "# nobody\n");
    assert!(
        within(Duration::from_secs(1), || reset(server.admin, &bearer(B))
            .body
            .contains("no token in it"))
        .is_some()
    );
    replace(&tokens, &format!("ops:{B}\n"));
    assert!(
        within(Duration::from_secs(1), || reset(server.admin, &bearer(B))
            .status
            == 200)
        .is_some()
    );
}

#[test]
fn a_token_file_others_may_read_or_a_bad_line_stops_start_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = token_file(dir.path(), "tokens", &format!("ops:{A}\n"));
    let args = ["--rules", "examples/rules", "--admin-token-file", &tokens];
    let chmod = |mode: u32| {
        std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod")
    };
    for (mode, shown) in [(0o644, "0644"), (0o660, "0660"), (0o604, "0604")] {
        chmod(mode);
        crate::common::run_briefly(&args, &[]).assert_refused(&[&tokens, shown, "chmod 600"]);
    }
    // Its group may read it (a Kubernetes Secret: defaultMode 0440, fsGroup).
    chmod(0o440);
    let group = crate::common::run_briefly(&args, &[]);
    assert!(group.success, "{}", group.stderr);
    chmod(0o644);
    let off = crate::common::run_briefly(&args, &[("TOLLGATE_ADMIN_TOKEN_FILE_MODE_CHECK", "off")]);
    assert!(off.success, "{}", off.stderr);
    for (text, says) in [
        (
            format!("# ops\n:{A}\n"),
            "line 2: the name before ':' is empty",
        ),
        ("ops:\n".to_owned(), "line 1: token 'ops' is empty"),
    ] {
        let bad = token_file(dir.path(), "bad", &text);
        crate::common::run_briefly(
            &["--rules", "examples/rules", "--admin-token-file", &bad],
            &[],
        )
        .assert_refused(&[&bad, says]);
    }
}

/// 2,000 wrong tokens: ten answered 401, the rest 429 with Retry-After
/// without a look at their token (a good one too), all counted, logged in
/// a line or two without the tokens.
#[test]
fn failed_attempts_are_counted_logged_summarised_and_throttled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = token_file(dir.path(), "tokens", &format!("ops:{A}\n"));
    let server = Tollgate::start(RULES, &["--admin-token-file", &tokens]);
    let mut statuses = std::collections::BTreeMap::new();
    let mut retry_after = None;
    for i in 0..2000 {
        let r = reset(server.admin, &format!("Bearer wrong-token-number-{i:05}"));
        if r.status == 429 {
            retry_after = r.header("retry-after").map(str::to_owned);
        }
        *statuses.entry(r.status).or_insert(0) += 1;
    }
    assert_eq!(
        statuses,
        [(401, 10), (429, 1990)].into_iter().collect(),
        "10 failures a minute by default"
    );
    let wait: u64 = retry_after.expect("Retry-After").parse().expect("seconds");
    assert!((1..=60).contains(&wait), "{wait}");
    assert_eq!(
        reset(server.admin, &bearer(A)).status,
        429,
        "not even looked at"
    );
    assert_eq!(server.metric("tollgate_admin_auth_failures_total"), 10);
    assert_eq!(server.metric("tollgate_admin_auth_throttled_total"), 1991);
    let log = server.stderr.lock().expect("stderr").clone();
    let lines = log
        .lines()
        .filter(|l| l.contains("wrong or missing bearer token"))
        .count();
    assert!((1..=2).contains(&lines), "{log}");
    assert!(log.contains("127.0.0.1"), "the caller: {log}");
    assert!(
        !log.contains("wrong-token-number"),
        "never the token: {log}"
    );
}

/// The audit line of a reset names the token and the caller's address;
/// `bearer` and `BEARER` are the scheme too; a read-only token reads and
/// cannot reset.
#[test]
fn resets_are_audited_with_the_caller_and_read_only_tokens_cannot_reset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = token_file(dir.path(), "tokens", &format!("ops:{A}\nread viewer:{B}\n"));
    let server = Tollgate::start(
        RULES,
        &["--admin-token-file", &tokens, "--admin-reads", "token"],
    );
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let r = reset(server.admin, &format!("{scheme} {A}"));
        assert_eq!(r.status, 200, "{scheme}: {}", r.body);
    }
    let audit = || -> Vec<String> {
        server
            .stderr
            .lock()
            .expect("stderr")
            .lines()
            .filter(|l| l.contains("counters reset by an operator"))
            .map(str::to_owned)
            .collect()
    };
    // The server's stderr is read by a thread of the harness: the third
    // line may be a moment behind the third answer.
    holds_within(Duration::from_secs(5), || audit().len() == 3);
    let audit = audit();
    assert_eq!(audit.len(), 3, "{audit:?}");
    assert!(
        audit
            .iter()
            .all(|l| l.contains("ops") && l.contains("127.0.0.1:")),
        "{audit:?}"
    );
    let refused = reset(server.admin, &bearer(B));
    assert_eq!(refused.status, 403);
    assert!(
        refused.body.contains("'viewer' is read-only"),
        "{}",
        refused.body
    );
    let read = http(
        server.admin,
        "GET",
        "/limited",
        &[("Authorization", &bearer(B))],
    )
    .expect("admin");
    assert_eq!(read.status, 200, "{}", read.body);
}

/// With `--admin-reads token`, every endpoint that shows a client's counters
/// or buckets needs a token: `/limited`, `/counters`, `/json` (a decision
/// with what is left), `/rlqs`; `/metrics` (ranks, never clients) and
/// `/rlconfig` (the rules) stay open.
#[tokio::test(flavor = "multi_thread")]
async fn closed_reads_cover_json_and_rlqs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = token_file(dir.path(), "tokens", &format!("read viewer:{B}\n"));
    let server = Served::start(
        RULES,
        &["--admin-token-file", &tokens, "--admin-reads", "token"],
    );
    let json = [("Content-Type", "application/json")];
    for (method, path) in [
        ("GET", "/limited"),
        ("POST", "/counters"),
        ("POST", "/json"),
        ("GET", "/rlqs"),
    ] {
        let r = server.http(method, path, &json, BODY).await;
        assert_eq!(r.status, 401, "{method} {path}: {}", r.body);
        let with = [json[0], ("Authorization", &bearer(B))];
        let r = server.http(method, path, &with, BODY).await;
        assert_eq!(
            r.status, 200,
            "{method} {path} with a read token: {}",
            r.body
        );
    }
    for path in ["/metrics", "/rlconfig", "/healthcheck"] {
        assert_eq!(
            server.http("GET", path, &[], "").await.status,
            200,
            "{path}"
        );
    }
}

/// A request without a Host (HTTP/1.0) or with an empty one is refused as
/// a foreign one is.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_without_a_host_is_refused() {
    let server = Served::start(RULES, &[]);
    let admin = server.admin;
    let raw = move |request: &'static str| {
        let mut s = TcpStream::connect(admin).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        s.write_all(request.as_bytes()).expect("write");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    let answers = tokio::task::spawn_blocking(move || {
        [
            raw("GET /rlconfig HTTP/1.0\r\n\r\n"),
            raw("GET /rlconfig HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n"),
            raw("GET /rlconfig HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"),
        ]
    })
    .await
    .expect("thread");
    assert!(
        answers[0].starts_with("HTTP/1.0 421") || answers[0].starts_with("HTTP/1.1 421"),
        "{}",
        answers[0]
    );
    assert!(
        answers[0].contains("without a Host header"),
        "{}",
        answers[0]
    );
    assert!(answers[1].starts_with("HTTP/1.1 421"), "{}", answers[1]);
    assert!(answers[2].starts_with("HTTP/1.1 200"), "{}", answers[2]);
}

/// `tollgate top` reads an admin port served over TLS, verifying its
/// certificate against `--ca-file`, and refuses one it cannot verify.
#[tokio::test(flavor = "multi_thread")]
async fn top_speaks_tls_to_an_admin_port_that_serves_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = crate::common::tls::Pki::new(dir.path());
    let tokens = token_file(dir.path(), "tokens", &format!("read viewer:{B}\n"));
    let rules = "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let server = Tollgate::start(
        rules,
        &[
            "--tls-cert",
            &pki.path("server"),
            "--tls-key",
            &pki.key_path("server"),
            "--admin-tls",
            "on",
            "--admin-token-file",
            &tokens,
            "--admin-reads",
            "token",
        ],
    );
    for _ in 0..3 {
        let config = crate::common::tls::client_config(&pki, "ca", None);
        crate::common::tls::tls_call(server.addr, config)
            .await
            .expect("a call over TLS");
    }
    let (ok, out, err) = top(
        server.admin,
        "https",
        &tokens,
        &["--ca-file", &pki.path("ca")],
    );
    assert!(ok && out.contains("user=ann"), "{out}{err}");
    let (ok, _, err) = top(server.admin, "https", &tokens, &[]);
    assert!(!ok && err.to_lowercase().contains("certificate"), "{err}");
}

/// `tollgate top --once` on `scheme://admin`: (success, stdout, stderr).
fn top(admin: SocketAddr, scheme: &str, tokens: &str, extra: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["top", "--once", "--token-file", tokens, "--admin"])
        .arg(format!("{scheme}://{admin}"))
        .args(extra)
        // A terminal wide enough for the escaped values whole (`top` cuts a
        // client's line at the terminal's width).
        .env("COLUMNS", "200")
        .output()
        .expect("runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What clients sent is printed by `tollgate top` with escape sequences
/// (a title, the clipboard through OSC 52) and bidi or invisible
/// characters escaped, never raw.
#[tokio::test(flavor = "multi_thread")]
async fn top_prints_escape_sequences_and_invisibles_escaped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = token_file(dir.path(), "tokens", &format!("read viewer:{B}\n"));
    let server = Tollgate::start(RULES, &[]);
    let mut client = server.client().await;
    let evil = "mallory\u{1b}]0;owned\u{7}\u{1b}]52;c;Zm9v\u{7}\u{202e}nimda\u{200b}";
    for _ in 0..7 {
        ask(&mut client, request("api", &[&[("user", evil)]])).await;
    }
    let (ok, out, err) = top(server.admin, "http", &tokens, &[]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(r"user=mallory\u{1b}]0;owned\u{7}\u{1b}]52;c;Zm9v\u{7}\u{202e}nimda\u{200b}"),
        "{out}"
    );
    assert!(
        !out.contains('\u{1b}') && !out.contains('\u{202e}'),
        "{out:?}"
    );
}
