//! Hostile clients against a real `tollgate serve`: oversized and malformed
//! requests, connections that never speak, streams that never end, slow
//! admin clients, metric label floods, and the settings a platform injects.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::common::envoy::http;
use crate::common::raw::{PATH, ask_bytes, frame, raw_call, raw_call_answer, request_bytes};
use crate::common::redis::RedisServer;
use crate::common::{
    Served, Tollgate, ask, descriptor, eventually, holds_within, request, run_briefly, wait_until,
};
use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tollgate::test_util::InProcess;

const RULES: &str = "domain: gw
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: ip
    value: 10.0.0.1
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: detail
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  # A token bucket: no window edge for the wall clock to cross while a test
  # counts (a sliding window admits a fourth request just past the hour).
  - key: victim
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: token_bucket, failure_mode: deny}
";

/// [`RULES`] without the limit that fails closed: requests that cannot be
/// decided are answered with an error naming why (with it, OVER_LIMIT).
fn open_rules() -> String {
    let (open, _) = RULES
        .split_once("  - key: victim")
        .expect("the victim rule");
    open.to_owned()
}

/// Whether the server closes `stream` (EOF or reset) within `within`.
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// The header a `/json` request needs.
const JSON: &[(&str, &str)] = &[("Content-Type", "application/json")];

/// The HTTP/2 client preface and an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// The count of `over_limit` answers in `answers`.
fn refused(answers: &[RateLimitResponse]) -> usize {
    answers
        .iter()
        .filter(|a| a.overall_code == Code::OverLimit as i32)
        .count()
}

#[tokio::test]
async fn bytes_that_are_not_utf8_are_counted_distinctly_not_refused() {
    let server = Served::start(RULES, &[]);
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(ask_bytes(server.addr, b"gw", &[&[(b"user", b"mallory\xff")]]).await);
    }
    assert_eq!(
        refused(&answers),
        2,
        "3 an hour, as for any user: {answers:?}"
    );
    // Other bytes are another client; the marker's text is a third.
    let mut others = Vec::new();
    for value in [&b"mallory\xfe"[..], "\u{FFFD}mallory\\xff".as_bytes()] {
        for _ in 0..3 {
            others.push(ask_bytes(server.addr, b"gw", &[&[(b"user", value)]]).await);
        }
    }
    assert_eq!(refused(&others), 0, "{others:?}");
    // A domain or key that is not UTF-8 is read too (and matches nothing).
    let other = ask_bytes(server.addr, b"g\xffw", &[&[(b"us\xc3er", b"a")]]).await;
    assert_eq!(other.overall_code, Code::Ok as i32);
    // The view of who is limited shows the value escaped.
    let limited = server.http("GET", "/limited", &[], "").await;
    assert!(limited.body.contains("mallory\\\\xff"), "{}", limited.body);
}

/// `/json` reads a text as gRPC reads the same text sent: one beginning with
/// the marker is escaped, so `/json` cannot spend the counter of a client
/// whose bytes were not UTF-8 (gRPC cannot either), and a marked UTF-8 text
/// is one counter whichever way it came.
#[tokio::test]
async fn json_texts_are_read_as_the_same_text_sent_over_grpc() {
    let server = Served::start(RULES, &[]);
    let json = |value: &str| {
        format!(
            r#"{{"domain":"gw","descriptors":[{{"entries":[{{"key":"user","value":"{value}"}}]}}]}}"#
        )
    };
    // The escaped form of b"mallory\xff", sent to /json three times.
    for _ in 0..3 {
        let r = server
            .http("POST", "/json", JSON, &json("\\ufffdmallory\\\\xff"))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let bytes = ask_bytes(server.addr, b"gw", &[&[(b"user", b"mallory\xff")]]).await;
    assert_eq!(
        bytes.overall_code,
        Code::Ok as i32,
        "/json spent its counter"
    );
    // A marked UTF-8 text: one counter over gRPC and /json together.
    for _ in 0..2 {
        let r = server
            .http("POST", "/json", JSON, &json("\\ufffdtwin"))
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let grpc = ask_bytes(
        server.addr,
        b"gw",
        &[&[(b"user", "\u{FFFD}twin".as_bytes())]],
    )
    .await;
    assert_eq!(grpc.overall_code, Code::Ok as i32, "the third of 3");
    let r = server
        .http("POST", "/json", JSON, &json("\\ufffdtwin"))
        .await;
    assert_eq!(r.status, 429, "the fourth of 3: {}", r.body);
}

/// `--max-value-bytes` counts the bytes sent: a value that is not UTF-8 is
/// up to four times longer once made text (`\xff` a byte), and a bound on
/// the text let a 16 KiB header refuse the whole request, which Envoy lets
/// through with every limit skipped.
#[tokio::test]
async fn the_value_bound_counts_the_bytes_sent_not_their_text() {
    // Without the rule that fails closed: a request past a bound is an
    // error here, not the refusal of a request that cannot be decided.
    let server = Served::start(&open_rules(), &["--max-request-bytes", "400000"]);
    let long = vec![0xffu8; 20_000];
    let mut answers = Vec::new();
    for _ in 0..5 {
        answers.push(ask_bytes(server.addr, b"gw", &[&[(b"user", &long)]]).await);
    }
    assert_eq!(refused(&answers), 2, "decided, 3 an hour: {answers:?}");
    // At the bound as sent (65,536 bytes, 262,147 once made text): decided.
    let at_bound = vec![0xffu8; 65_536];
    let answer = ask_bytes(server.addr, b"gw", &[&[(b"user", &at_bound)]]).await;
    assert_eq!(answer.overall_code, Code::Ok as i32, "{answer:?}");
    // One byte past it is past it: refused, the bytes sent named.
    let past = vec![0xffu8; 65_537];
    let body = frame(&request_bytes(b"gw", &[&[(b"user", &past)]]));
    let (status, grpc, _) = raw_call_answer(server.addr, "application/grpc", body, false).await;
    assert_eq!(
        (status, grpc.as_deref()),
        (200, Some("3")),
        "INVALID_ARGUMENT"
    );
}

#[tokio::test]
async fn requests_that_cannot_be_decided_are_refused_where_a_limit_fails_closed() {
    let server = Served::start(RULES, &["--max-request-bytes", "200000"]);
    let ok = frame(&prost::Message::encode_to_vec(&request(
        "gw",
        &[&[("user", "a")]],
    )));
    let mut compressed = ok.clone();
    compressed[0] = 1;
    let mut huge_prefix = ok.clone();
    huge_prefix[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
    let long = "x".repeat(70_000);
    let wide: Vec<(Vec<u8>, Vec<u8>)> = (0..33)
        .map(|i| (format!("k{i}").into_bytes(), b"v".to_vec()))
        .collect();
    let wide: Vec<(&[u8], &[u8])> = wide.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    let undecidable = [
        ("a message cut short", frame(&[0x0a, 100, b'g', b'w'])),
        ("a compressed message", compressed),
        ("no message", Vec::new()),
        ("two messages", [ok.clone(), ok.clone()].concat()),
        ("a length above the bound", huge_prefix),
        (
            "a value above --max-value-bytes",
            frame(&request_bytes(b"gw", &[&[(b"user", long.as_bytes())]])),
        ),
        (
            "entries above --max-entries",
            frame(&request_bytes(b"gw", &[&wide])),
        ),
        (
            "an empty key",
            frame(&request_bytes(b"gw", &[&[(b"", b"v")]])),
        ),
    ];
    for (what, body) in &undecidable {
        let (status, grpc, answer) =
            raw_call_answer(server.addr, "application/grpc", body.clone(), false).await;
        assert_eq!(
            (status, grpc.as_deref()),
            (200, Some("0")),
            "{what}: answered, not failed"
        );
        assert_eq!(
            answer.map(|a| a.overall_code),
            Some(Code::OverLimit as i32),
            "{what}: refused, since domain gw has a limit with failure_mode deny"
        );
    }
    assert_eq!(
        server.metric("tollgate_undecided_refused_total").await,
        undecidable.len() as u64
    );
    // A domain with no such limit is answered as the reference answers.
    let (_, grpc, _) = raw_call_answer(
        server.addr,
        "application/grpc",
        frame(&request_bytes(
            b"elsewhere",
            &[&[(b"user", long.as_bytes())]],
        )),
        false,
    )
    .await;
    assert_eq!(grpc.as_deref(), Some("3"), "INVALID_ARGUMENT");
    // The whole process failing closed by default (--failure-mode deny)
    // counts too, for any domain with a limit.
    let closed = Served::start(&open_rules(), &["--failure-mode", "deny"]);
    let (_, grpc, answer) =
        raw_call_answer(closed.addr, "application/grpc", frame(&[0x0a, 100]), false).await;
    assert_eq!(grpc.as_deref(), Some("0"));
    assert_eq!(answer.map(|a| a.overall_code), Some(Code::OverLimit as i32));
}

#[tokio::test]
async fn oversized_requests_are_refused_naming_the_bound() {
    let server = Served::start(&open_rules(), &["--max-request-bytes", "200000"]);
    let mut client = server.client().await;
    let many = RateLimitRequest {
        domain: "gw".into(),
        descriptors: (0..5_000)
            .map(|i| descriptor(&[("user", &i.to_string())]))
            .collect(),
        hits_addend: 0,
    };
    let started = Instant::now();
    let refused = client.should_rate_limit(many).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("--max-descriptors"),
        "{}",
        refused.message()
    );
    // Refused before any work proportional to its size is done (the old
    // quadratic path took seconds for this).
    assert!(started.elapsed() < Duration::from_secs(2));

    let wide: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
    let wide: Vec<(&str, &str)> = wide.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let refused = client
        .should_rate_limit(request("gw", &[&wide]))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("--max-entries"),
        "{}",
        refused.message()
    );

    let long = "x".repeat(70_000);
    let refused = client
        .should_rate_limit(request("gw", &[&[("user", &long)]]))
        .await
        .expect_err("refused");
    assert!(
        refused.message().contains("--max-value-bytes"),
        "{}",
        refused.message()
    );

    let huge = "x".repeat(300_000);
    let refused = client
        .should_rate_limit(request("gw", &[&[("user", &huge)]]))
        .await
        .expect_err("refused before decoding");
    assert_ne!(refused.code(), tonic::Code::Ok);
    assert!(
        refused.message().contains("200000"),
        "{}",
        refused.message()
    );

    // The same bounds on /json.
    let entries: Vec<String> = (0..200)
        .map(|i| format!(r#"{{"entries":[{{"key":"user","value":"{i}"}}]}}"#))
        .collect();
    let body = format!(r#"{{"domain":"gw","descriptors":[{}]}}"#, entries.join(","));
    let r = server.http("POST", "/json", JSON, &body).await;
    assert_eq!(r.status, 400);
    assert!(r.body.contains("--max-descriptors"), "{}", r.body);

    // And the server still answers ordinary requests.
    let ok = ask(&mut client, request("gw", &[&[("user", "a")]])).await;
    assert_eq!(ok.overall_code, Code::Ok as i32);
}

#[tokio::test]
async fn malformed_bodies_and_content_types_are_the_clients_error() {
    let server = Served::start(&open_rules(), &[]);
    // Field 1 (domain) as a length-delimited string of 100 bytes, cut short.
    let garbage = frame(&[0x0a, 100, b'g', b'w']);
    let (status, grpc) = raw_call(server.addr, "application/grpc", garbage, false).await;
    assert_eq!(status, 200);
    assert_eq!(grpc.as_deref(), Some("3"), "INVALID_ARGUMENT");
    let (status, _) = raw_call(server.addr, "application/json", b"{}".to_vec(), false).await;
    assert_eq!(status, 415, "a non-gRPC content type is refused");
    // Framing: a compressed message, no message, two messages, a length
    // prefix above the bound. Each gets a gRPC status, never a crash.
    let ok = frame(&[0x0a, 2, b'g', b'w']);
    let mut compressed = ok.clone();
    compressed[0] = 1;
    let two = [ok.clone(), ok.clone()].concat();
    let mut huge_prefix = ok.clone();
    huge_prefix[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
    for (body, code, what) in [
        (compressed, "12", "UNIMPLEMENTED for a compressed message"),
        (Vec::new(), "3", "INVALID_ARGUMENT for no message"),
        (vec![0, 0], "3", "INVALID_ARGUMENT for a cut prefix"),
        (two, "3", "INVALID_ARGUMENT for two messages"),
        (
            huge_prefix,
            "8",
            "RESOURCE_EXHAUSTED for a length above the bound",
        ),
    ] {
        let (status, grpc) = raw_call(server.addr, "application/grpc", body, false).await;
        assert_eq!((status, grpc.as_deref()), (200, Some(code)), "{what}");
    }
    let valid = frame(&prost::Message::encode_to_vec(&request(
        "gw",
        &[&[("user", "a")]],
    )));
    let (_, grpc) = raw_call(server.addr, "application/grpc", valid, false).await;
    assert_eq!(
        grpc.as_deref(),
        Some("0"),
        "a well-formed call still answers"
    );
    // An out-of-range numeric unit on /json is refused, not truncated.
    let body = r#"{"domain":"gw","descriptors":[{"entries":[{"key":"user","value":"u"}],
        "limit":{"requestsPerUnit":5,"unit":4294967298}}]}"#;
    let r = server.http("POST", "/json", JSON, body).await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("unit"), "{}", r.body);
}

#[tokio::test]
async fn a_stream_that_never_ends_is_cut_at_the_request_timeout() {
    let server = Served::start(RULES, &["--request-timeout", "300ms"]);
    let message = frame(&[0x0a, 2, b'g', b'w']);
    // Announce a longer message than is sent, and never end the stream.
    let mut partial = message.clone();
    partial[4] += 10;
    let started = Instant::now();
    let (_, grpc) = tokio::time::timeout(
        Duration::from_secs(5),
        raw_call(server.addr, "application/grpc", partial, true),
    )
    .await
    .expect("the server ends the call");
    assert_eq!(grpc.as_deref(), Some("4"), "DEADLINE_EXCEEDED");
    assert!(started.elapsed() >= Duration::from_millis(300));
}

/// A client that never reads its answer (a stream window of zero, PINGs
/// answered) cannot hold the stream past --request-timeout: its connection
/// is closed (issue 22: neither reset nor ended after 60 s).
#[tokio::test]
async fn a_client_that_never_reads_its_answer_is_cut_off() {
    let server = Served::start(RULES, &["--request-timeout", "300ms"]);
    let tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    let connection = tokio::spawn(conn);
    let body = frame(&prost::Message::encode_to_vec(&request(
        "gw",
        &[&[("user", "a")]],
    )));
    let call = http::Request::post(format!("http://{}{PATH}", server.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .expect("request");
    let started = Instant::now();
    // The answer's headers come; its message cannot (the window is zero),
    // and the response is held, unread.
    let response = sender.send_request(call).await.expect("headers");
    let ended = tokio::time::timeout(Duration::from_secs(5), connection).await;
    assert!(ended.is_ok(), "the connection is still open after 5 s");
    assert!(started.elapsed() >= Duration::from_millis(300));
    drop(response);
    // Others are served as before.
    let mut client = server.client().await;
    ask(&mut client, request("gw", &[&[("user", "a")]])).await;
}

/// Tollgate in this process on this test's paused clock (see
/// `tollgate::test_util::InProcess`), serving [`RULES`].
fn in_process(args: &[&str]) -> (InProcess, tempfile::TempDir) {
    let served = Served::start(RULES, args);
    (served.server, served.dir)
}

/// Whether the server closes `stream` (EOF or reset) within `within`, on
/// Tokio's clock.
async fn closed_in_time(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        while let Ok(n) = stream.read(&mut buf).await
            && n > 0
        {}
    })
    .await
    .is_ok()
}

/// Waits (on Tokio's clock, a millisecond at a time) until `series` in the
/// in-process server's metrics is `value`. Not `crate::common::eventually`: its
/// 20 ms steps would move the paused clock between connections whose
/// timeouts the tests compare to 10 ms (and its deadline is the wall's).
async fn gauge_reaches(server: &InProcess, series: &str, value: u64) {
    let waited = tokio::time::timeout(Duration::from_secs(5), async {
        while server.metric(series) != Some(value) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "{series} stayed {:?}, not {value}",
        server.metric(series)
    );
}

/// One HTTP/1.1 GET on a new connection, on the runtime: the status code.
async fn get_status(addr: SocketAddr, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    tcp.write_all(head.as_bytes()).await.expect("request");
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.expect("answer");
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status: {answer}"))
}

/// The default handshake timeout (5 s) and an idle timeout of 5 minutes,
/// on a paused clock: each closes its connection when due, not before, and
/// the test takes no minutes (nor the seconds it took on the wall clock:
/// it used to run with 300 ms and 500 ms timeouts, loose bounds and no
/// lower ones). Each second of the paused clock still runs the server's
/// once-a-second tasks: the default hour took 3.3 s of wall time.
#[tokio::test(start_paused = true)]
async fn connections_that_never_speak_or_go_idle_are_closed_when_due() {
    use tokio::io::AsyncWriteExt;
    let (server, _rules) = in_process(&["--idle-timeout", "5m", "--keepalive", "off"]);
    let started = tokio::time::Instant::now();
    let mut silent = tokio::net::TcpStream::connect(server.grpc)
        .await
        .expect("connect");
    assert!(
        !closed_in_time(&mut silent, Duration::from_millis(4900)).await,
        "no preface: still open before the 5 s handshake timeout"
    );
    assert!(
        closed_in_time(&mut silent, Duration::from_millis(200)).await,
        "no preface: closed at 5 s"
    );
    let closed_at = started.elapsed();
    assert!(
        (Duration::from_secs(5)..Duration::from_millis(5100)).contains(&closed_at),
        "{closed_at:?}"
    );
    let mut idle = tokio::net::TcpStream::connect(server.grpc)
        .await
        .expect("connect");
    idle.write_all(PREFACE).await.expect("preface");
    gauge_reaches(&server, "tollgate_grpc_connections", 1).await;
    assert!(
        !closed_in_time(&mut idle, Duration::from_secs(299)).await,
        "idle: still open before 5 minutes"
    );
    // Closed gracefully: GOAWAY at 5 minutes, the connection a second later.
    assert!(
        closed_in_time(&mut idle, Duration::from_secs(3)).await,
        "idle: closed at 5 minutes"
    );
    gauge_reaches(&server, "tollgate_grpc_connections", 0).await;
    // Envoy's kind of client reconnects and carries on.
    let mut client = RateLimitServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .expect("connect");
    ask(&mut client, request("gw", &[&[("user", "a")]])).await;
    server.stop().await.expect("stops");
}

/// The admin port under slow and idle clients, on a paused clock: slow
/// headers are cut at --admin-timeout, idle connections make room for new
/// ones (the oldest first), busy ones do not, and health checks get in
/// once the busy ones time out. Each step waits for the gauges of open and
/// busy admin connections, read in process (a scrape would take a slot).
#[tokio::test(start_paused = true)]
async fn slow_admin_clients_are_cut_off_and_bounded() {
    use tokio::io::AsyncWriteExt;
    let (server, _rules) = in_process(&["--admin-timeout", "2s", "--max-admin-connections", "2"]);
    let connect = || tokio::net::TcpStream::connect(server.admin);
    let mut slow = connect().await.expect("connect");
    slow.write_all(b"GET /metr")
        .await
        .expect("half a request line");
    assert!(
        !closed_in_time(&mut slow, Duration::from_millis(1900)).await,
        "slow headers: open within the 2 s"
    );
    assert!(
        closed_in_time(&mut slow, Duration::from_millis(200)).await,
        "slow headers: closed at 2 s"
    );
    gauge_reaches(&server, "tollgate_admin_connections", 0).await;
    // Two idle connections take both slots, a before b; a third makes room
    // by closing the one idle the longest.
    let mut a = connect().await.expect("connect");
    gauge_reaches(&server, "tollgate_admin_connections", 1).await;
    let mut b = connect().await.expect("connect");
    gauge_reaches(&server, "tollgate_admin_connections", 2).await;
    let mut c = connect().await.expect("connect");
    assert!(
        closed_in_time(&mut a, Duration::from_millis(10)).await,
        "the oldest idle connection: closed at once"
    );
    gauge_reaches(&server, "tollgate_admin_connections", 2).await;
    // Busy connections are not evicted: b and c each hold a request whose
    // body never ends, and a fourth connection is turned away.
    let request = format!(
        "POST /json HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{",
        server.admin
    );
    for busy in [&mut b, &mut c] {
        busy.write_all(request.as_bytes())
            .await
            .expect("a request in progress");
    }
    gauge_reaches(&server, "tollgate_admin_connections_busy", 2).await;
    let mut d = connect().await.expect("connect");
    assert!(
        closed_in_time(&mut d, Duration::from_millis(10)).await,
        "every connection busy: the new one is closed at once"
    );
    assert!(
        !closed_in_time(&mut b, Duration::from_millis(1500)).await,
        "busy: open within its 2 s"
    );
    assert!(closed_in_time(&mut b, Duration::from_secs(1)).await);
    assert!(closed_in_time(&mut c, Duration::from_millis(10)).await);
    gauge_reaches(&server, "tollgate_admin_connections_busy", 0).await;
    assert_eq!(get_status(server.admin, "/healthcheck").await, 200);
    server.stop().await.expect("stops");
}

#[tokio::test]
async fn connections_past_the_limit_are_closed_and_room_comes_back() {
    let server = Tollgate::start(RULES, &["--max-connections", "2", "--workers", "1"]);
    let mut held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(server.addr).expect("connect");
            s.write_all(PREFACE).expect("preface");
            s
        })
        .collect();
    // Both accepted: the gauge of open connections says so.
    wait_until("both connections accepted", Duration::from_secs(5), || {
        server.metric("tollgate_grpc_connections") == 2
    });
    let mut third = TcpStream::connect(server.addr).expect("the kernel accepts");
    assert!(
        closed_within(&mut third, Duration::from_secs(2)),
        "over the limit: closed"
    );
    assert_eq!(
        server.metric("tollgate_grpc_connections"),
        2,
        "the third was never counted"
    );
    held.clear();
    let room = eventually(Duration::from_secs(5), async || {
        let mut client = server.client().await;
        client
            .should_rate_limit(request("gw", &[&[("user", "b")]]))
            .await
            .is_ok()
    })
    .await;
    assert!(room, "room came back once the others closed");
    assert_eq!(
        server.log_count("connection limit reached"),
        1,
        "logged once"
    );
}

/// Admin listeners share --max-admin-connections, and so the idle
/// connections one of them can close to make room: an idle connection on
/// the first does not lock the second out.
#[tokio::test(start_paused = true)]
async fn admin_listeners_share_their_bound_and_its_idle_connections() {
    let (server, _rules) = in_process(&[
        "--admin-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
        "--max-admin-connections",
        "1",
    ]);
    let [first, second] = server.admins[..] else {
        panic!("two admin listeners: {:?}", server.admins);
    };
    let mut idle = tokio::net::TcpStream::connect(first)
        .await
        .expect("connect");
    gauge_reaches(&server, "tollgate_admin_connections", 1).await;
    assert_eq!(get_status(second, "/healthcheck").await, 200);
    assert!(
        closed_in_time(&mut idle, Duration::from_millis(10)).await,
        "the idle connection on the other listener made room"
    );
    server.stop().await.expect("stops");
}

#[tokio::test]
async fn metric_label_sets_from_requests_are_capped_and_cut() {
    let server = Served::start(
        RULES,
        &["--max-metric-series", "5", "--max-label-bytes", "16"],
    );
    let mut client = server.client().await;
    for i in 0..20 {
        let mut r = request("gw", &[&[(format!("random{i}").as_str(), "v")]]);
        r.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: 9,
            unit: Unit::Hour as i32,
        });
        ask(&mut client, r).await;
    }
    let long = "y".repeat(1000);
    ask(&mut client, request("gw", &[&[("detail", &long)]])).await;
    ask(&mut client, request("gw", &[&[("ip", "10.0.0.1")]])).await;
    let body = server.metrics().await;
    let series: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .collect();
    let from_requests = series
        .iter()
        .filter(|l| l.contains("random") || l.contains("detail"))
        .count();
    assert_eq!(from_requests, 5, "{series:#?}");
    assert!(
        series.iter().any(|l| l.contains(r#"overflow="true""#)),
        "{series:#?}"
    );
    assert!(
        body.contains("tollgate_metric_series_overflow_total 16"),
        "15 overrides and the detailed one"
    );
    assert!(
        series.iter().all(|l| l.len() < 200),
        "values are cut: {series:#?}"
    );
    // A value with dots stays one label.
    assert!(
        series
            .iter()
            .any(|l| l.contains(r#"domain="gw",key1="ip_10.0.0.1"}"#)),
        "{series:#?}"
    );
}

#[tokio::test]
async fn limits_of_zero_and_unlimited_rules_answer_like_the_reference() {
    let server = Served::start(RULES, &[]);
    let mut client = server.client().await;
    let closed = ask(&mut client, request("gw", &[&[("closed", "x")]])).await;
    assert_eq!(closed.overall_code, Code::OverLimit as i32);
    assert!(
        !closed
            .response_headers_to_add
            .iter()
            .any(|h| h.key.eq_ignore_ascii_case("retry-after")),
        "nothing will ever be admitted: no Retry-After"
    );
    let free = ask(
        &mut client,
        request("gw", &[&[("free", "x")], &[("nomatch", "y")]]),
    )
    .await;
    assert_eq!(free.statuses[0].limit_remaining, u32::MAX, "unlimited");
    assert_eq!(free.statuses[1].limit_remaining, 0, "no rule");
}

#[tokio::test]
async fn a_store_outage_fails_health_only_when_errors_are_the_answer() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let server = Tollgate::start(
        RULES,
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-timeout",
            "1s",
            "--on-store-error",
            "unavailable",
        ],
    );
    let health = || http(server.admin, "GET", "/healthcheck", &[]).expect("answer");
    let within = |status: u16| {
        let mut last = health();
        let reached = holds_within(Duration::from_secs(10), || {
            last = health();
            last.status == status
        });
        assert!(reached, "health stayed {}: {}", last.status, last.body);
        last
    };
    within(200);
    redis.kill();
    let down = within(500);
    assert!(down.body.contains("store"), "{}", down.body);
}

#[test]
fn start_up_tolerates_kubernetes_service_variables_and_refuses_typos_and_zeros() {
    // What the kubelet injects for a Service named `tollgate` with a port named grpc.
    let injected = [
        ("TOLLGATE_SERVICE_HOST", "10.96.0.12"),
        ("TOLLGATE_SERVICE_PORT", "8081"),
        ("TOLLGATE_SERVICE_PORT_GRPC", "8081"),
        ("TOLLGATE_PORT", "tcp://10.96.0.12:8081"),
        ("TOLLGATE_PORT_8081_TCP", "tcp://10.96.0.12:8081"),
        ("TOLLGATE_PORT_8081_TCP_PROTO", "tcp"),
        ("TOLLGATE_PORT_8081_TCP_PORT", "8081"),
        ("TOLLGATE_PORT_8081_TCP_ADDR", "10.96.0.12"),
        ("TOLLGATE_REDIS_SERVICE_HOST", "10.96.0.13"),
        ("TOLLGATE_REDIS_PORT", "tcp://10.96.0.13:6379"),
    ];
    let out = run_briefly(&[], &injected);
    assert!(out.started, "started: {} {}", out.stdout, out.stderr);

    let out = run_briefly(&[], &[("TOLLGATE_MAX_DESCRIPTOR", "10")]);
    out.assert_refused(&["TOLLGATE_MAX_DESCRIPTOR"]);

    for flag in [
        "--max-keys",
        "--workers",
        "--redis-breaker",
        "--max-descriptors",
    ] {
        let out = run_briefly(&[flag, "0"], &[]);
        out.assert_refused(&[flag]);
    }
}

#[test]
fn a_rule_file_rewritten_in_place_is_loaded_only_once_it_settles() {
    use std::sync::Arc;
    use tollgate::clock::ManualClock;
    use tollgate::limiter::Limiter;
    use tollgate::rules::{LoadOptions, load_paths};

    use tollgate::test_util::Reloader;

    let rules = |keys: &[&str]| {
        let mut text = String::from("domain: r\ndescriptors:\n");
        for k in keys {
            text.push_str(&format!(
                "  - key: {k}\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"
            ));
        }
        text
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, rules(&["a", "b"])).expect("write");
    let loaded = load_paths(std::slice::from_ref(&path), &LoadOptions::default()).expect("rules");
    let limiter = Arc::new(Limiter::in_memory(loaded, Arc::new(ManualClock::new(0))));
    let reloader = Reloader::new(vec![path.clone()], LoadOptions::default(), limiter.clone());
    // An editor rewrites the file in place; the first look catches it half
    // written: valid YAML, with only the first of its three rules.
    std::fs::write(&path, rules(&["a"])).expect("write");
    assert!(!reloader.poll(), "a change seen once is not loaded");
    assert_eq!(limiter.rules().rules().len(), 2, "the rules in force stay");
    std::fs::write(&path, rules(&["a", "b", "c"])).expect("write");
    assert!(!reloader.poll(), "changed again since the last look");
    assert_eq!(limiter.rules().rules().len(), 2);
    assert!(reloader.poll(), "the same content twice: loaded");
    assert_eq!(limiter.rules().rules().len(), 3);
    assert!(!reloader.poll(), "nothing new");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_huge_requests_cannot_turn_redis_limits_off() {
    let redis = RedisServer::start();
    let url = redis.url();
    // A generous Redis timeout: on a loaded test machine the flood must not
    // make the victim's own calls time out, so its count is exact.
    let server = Tollgate::start(
        RULES,
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-timeout",
            "1s",
        ],
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut flood = Vec::new();
    for t in 0..4 {
        let mut client = server.client().await;
        let stop = stop.clone();
        flood.push(tokio::spawn(async move {
            let mut refused = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let huge = RateLimitRequest {
                    domain: "gw".into(),
                    descriptors: (0..2_000)
                        .map(|i| descriptor(&[("user", &format!("{t}-{i}"))]))
                        .collect(),
                    hits_addend: 0,
                };
                // Refused: its domain has a limit that fails closed.
                match client.should_rate_limit(huge).await {
                    Ok(r) if r.get_ref().overall_code == Code::OverLimit as i32 => refused += 1,
                    other => panic!("a 2,000-descriptor request was not refused: {other:?}"),
                }
            }
            refused
        }));
    }
    let mut client = server.client().await;
    let mut admitted = 0;
    for _ in 0..30 {
        let r = ask(&mut client, request("gw", &[&[("victim", "v")]])).await;
        admitted += usize::from(r.overall_code == Code::Ok as i32);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for f in flood {
        assert!(f.await.expect("flood task") > 0);
    }
    assert_eq!(admitted, 3, "the limit held through the flood");
    let body = server.metrics();
    assert!(
        body.contains("tollgate_store_circuit_open_total 0"),
        "the circuit never opened"
    );
}

#[test]
fn secrets_stay_out_of_logs_and_reference_variables_never_override_flags() {
    let redis = RedisServer::start();
    let url = format!("redis://:hunter2@127.0.0.1:{}", redis.port);
    let out = run_briefly(&["--store", "redis", "--redis-url", &url], &[]);
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(all.contains("gRPC listening"), "{all}");
    assert!(all.contains("***"), "the URL is logged redacted: {all}");
    assert!(!all.contains("hunter2"), "{all}");

    for (var, value, flag) in [
        ("LOG_FORMAT", "json", ["--log-format", "text"]),
        ("LOG_LEVEL", "debug", ["--log-level", "warn"]),
        (
            "LIMIT_RESPONSE_HEADERS_ENABLED",
            "false",
            ["--response-headers", "on"],
        ),
        ("NEAR_LIMIT_RATIO", "0.5", ["--near-limit-ratio", "0.9"]),
        (
            "LOCAL_CACHE_SIZE_IN_BYTES",
            "1000",
            ["--over-limit-cache", "off"],
        ),
    ] {
        let out = run_briefly(&flag, &[(var, value)]);
        out.assert_refused(&[var, flag[0]]);
    }
}

/// Idle connections past the bound cannot keep health checks out: each new
/// connection closes the one idle the longest (issue 22: 70 idle
/// connections, reopened every 5 s, let 1 of 18 probes through).
#[tokio::test]
async fn idle_admin_connections_never_keep_health_checks_out() {
    let server = Tollgate::start(RULES, &[]);
    let mut idle: Vec<TcpStream> = (0..70)
        .map(|_| TcpStream::connect(server.admin).expect("connect"))
        .collect();
    let mut answered = 0;
    for round in 0..18 {
        // The attacker reopens its idle connections now and then.
        if round % 5 == 4 {
            idle = (0..70)
                .map(|_| TcpStream::connect(server.admin).expect("connect"))
                .collect();
        }
        let started = Instant::now();
        let r = http(server.admin, "GET", "/healthcheck", &[]);
        match &r {
            Ok(r) if r.status == 200 && started.elapsed() < Duration::from_secs(1) => answered += 1,
            other => eprintln!("round {round}: {other:?} after {:?}", started.elapsed()),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(idle);
    assert_eq!(answered, 18, "health checks answered within 1 s");
}
