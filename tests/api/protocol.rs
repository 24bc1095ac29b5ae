//! What Envoy (and Istio) may send at the HTTP/2 level, written frame by
//! frame so nothing in between validates it first: any `:authority` is
//! answered; a call refused at the protocol level is counted and logged,
//! rate limited. And a second `tollgate serve` cannot share a taken port.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::common::{Tollgate, request, run_briefly_as_given};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use prost::Message;

const RULES: &str = "domain: gw
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
";

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

const HEADERS: u8 = 0x1;
const DATA: u8 = 0x0;
const RST_STREAM: u8 = 0x3;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// An HPACK integer with an `n`-bit prefix whose high bits are `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128 + 128) as u8);
        value /= 128;
    }
    out.push(value as u8);
}

/// A header block of literal fields without indexing, no Huffman coding.
fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0);
        hpack_int(&mut out, 0, 7, name.len());
        out.extend_from_slice(name.as_bytes());
        hpack_int(&mut out, 0, 7, value.len());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// One HTTP/2 frame read back.
pub(super) struct Frame {
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) stream: u32,
    pub(super) payload: Vec<u8>,
}

/// The first whole frame in `buf`, taken out of it; `None` until one is.
pub(super) fn next_frame(buf: &mut Vec<u8>) -> Option<Frame> {
    let len = u32::from_be_bytes([0, *buf.first()?, *buf.get(1)?, *buf.get(2)?]) as usize;
    if buf.len() < 9 + len {
        return None;
    }
    let frame = Frame {
        kind: buf[3],
        flags: buf[4],
        stream: u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff,
        payload: buf[9..9 + len].to_vec(),
    };
    buf.drain(..9 + len);
    Some(frame)
}

/// What the server did with one stream.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The stream was answered: the decoded answer's overall code, if a
    /// message came.
    Answered(Option<i32>),
    /// RST_STREAM with this error code.
    Reset(u32),
}

/// Sends one call per header list on one connection (streams 1, 3, ...),
/// each with a ShouldRateLimit body for `user=ann`, and returns what
/// happened to each.
fn calls(addr: SocketAddr, header_lists: &[Vec<(&str, &str)>]) -> Vec<Outcome> {
    let mut tcp = TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    let body = request("gw", &[&[("user", "ann")]]).encode_to_vec();
    let mut grpc = vec![0u8];
    grpc.extend_from_slice(&(body.len() as u32).to_be_bytes());
    grpc.extend_from_slice(&body);
    for (i, headers) in header_lists.iter().enumerate() {
        let stream = 1 + 2 * i as u32;
        out.extend(frame(HEADERS, END_HEADERS, stream, &header_block(headers)));
        out.extend(frame(DATA, END_STREAM, stream, &grpc));
    }
    tcp.write_all(&out).expect("write");

    let mut outcomes: Vec<Option<Outcome>> = header_lists.iter().map(|_| None).collect();
    let mut bodies: Vec<Vec<u8>> = header_lists.iter().map(|_| Vec::new()).collect();
    let mut buf = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while outcomes.iter().any(Option::is_none) && Instant::now() < deadline {
        let mut chunk = [0u8; 16384];
        match tcp.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => continue,
        }
        while let Some(Frame {
            kind,
            flags,
            stream,
            payload,
        }) = next_frame(&mut buf)
        {
            if stream == 0 || stream % 2 == 0 {
                continue;
            }
            let i = (stream as usize - 1) / 2;
            match kind {
                RST_STREAM => {
                    let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                    outcomes[i] = Some(Outcome::Reset(code));
                }
                DATA => bodies[i].extend_from_slice(&payload),
                _ => {}
            }
            if flags & END_STREAM != 0 && outcomes[i].is_none() {
                let message = bodies[i]
                    .get(5..)
                    .and_then(|m| RateLimitResponse::decode(m).ok())
                    .map(|r| r.overall_code);
                outcomes[i] = Some(Outcome::Answered(message));
            }
        }
    }
    outcomes
        .into_iter()
        .map(|o| o.expect("every stream ended within 5 s"))
        .collect()
}

fn call_headers(authority: &str) -> Vec<(&str, &str)> {
    vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", authority),
        (":path", PATH),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
}

#[test]
fn any_authority_envoy_may_send_is_answered() {
    let server = Tollgate::start(RULES, &[]);
    // Istio's cluster name (Envoy sends it when the gRPC service names no
    // authority), an empty one, an address, and a plain host name.
    let authorities = [
        "outbound|8081||tollgate.tollgate.svc.cluster.local",
        "",
        "10.0.0.7:8081",
        "tollgate",
    ];
    let lists: Vec<_> = authorities.iter().map(|a| call_headers(a)).collect();
    let outcomes = calls(server.addr, &lists);
    let codes: Vec<Option<i32>> = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Answered(Some(code)) => Some(*code),
            other => panic!("{authorities:?}: {other:?}"),
        })
        .collect();
    // Each is a real decision on the same key: the limit of 2 holds.
    let ok = Some(Code::Ok as i32);
    let over = Some(Code::OverLimit as i32);
    assert_eq!(codes, [ok, ok, over, over]);
    assert_eq!(server.metric("tollgate_grpc_protocol_errors_total"), 0);
}

#[test]
fn protocol_refusals_are_counted_and_logged_at_warn_once_per_interval() {
    let server = Tollgate::start(RULES, &["--log-level", "warn"]);
    let mut no_method = call_headers("tollgate");
    no_method.retain(|(name, _)| *name != ":method");
    let lists = vec![no_method; 20];
    let outcomes = calls(server.addr, &lists);
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Reset(1)),
        "PROTOCOL_ERROR resets: {outcomes:?}"
    );
    assert_eq!(server.metric("tollgate_grpc_protocol_errors_total"), 20);
    let line = "refused at the HTTP/2 protocol level";
    crate::common::wait_until("the summary line", Duration::from_secs(5), || {
        server.log_count(line) > 0
    });
    assert_eq!(server.log_count(line), 1, "one summary line, at warn");
    assert_eq!(server.log_count("refused=20"), 1);
    assert_eq!(server.log_count("missing method"), 1, "with the reason");
    // More refusals: counted at once. (That they are not logged again
    // within the interval is the unit test
    // logging::a_summary_is_written_at_once_then_at_most_once_per_interval,
    // which ticks the summary's clock by hand instead of waiting seconds.)
    calls(server.addr, &lists[..5]);
    assert_eq!(server.metric("tollgate_grpc_protocol_errors_total"), 25);
}

/// The refusals that come from elsewhere in h2 than a malformed message:
/// a header block above the 16 KiB the server accepts (431), a frame above
/// the largest frame size (the connection closed with FRAME_SIZE_ERROR)
/// and a CONTINUATION flood (ENHANCE_YOUR_CALM) are counted as the others
/// are.
#[test]
fn oversized_header_blocks_and_frames_and_floods_are_counted_too() {
    let server = Tollgate::start(RULES, &[]);
    let long = "x".repeat(16_200);
    let mut big = call_headers("tollgate");
    big.push(("x-padding", &long));
    let outcomes = calls(server.addr, &[big]);
    assert!(
        !matches!(outcomes[0], Outcome::Answered(Some(_))),
        "not decided: {outcomes:?}"
    );
    assert_eq!(server.metric("tollgate_grpc_protocol_errors_total"), 1);

    // A HEADERS frame of 20,000 bytes: above SETTINGS_MAX_FRAME_SIZE
    // (16,384, which the server leaves at its default).
    let oversized = frame(HEADERS, END_HEADERS, 1, &vec![0u8; 20_000]);
    assert_eq!(goaway(server.addr, &oversized), Some(6), "FRAME_SIZE_ERROR");
    assert_eq!(server.metric("tollgate_grpc_protocol_errors_total"), 2);
    // A header block spread over more CONTINUATION frames than h2 allows
    // (a flood, whatever their size): ENHANCE_YOUR_CALM.
    let mut flood = frame(HEADERS, 0, 1, &header_block(&call_headers("tollgate")[..1]));
    for _ in 0..8 {
        flood.extend(frame(CONTINUATION, 0, 1, &[]));
    }
    assert_eq!(goaway(server.addr, &flood), Some(11), "ENHANCE_YOUR_CALM");
    assert_eq!(server.metric("tollgate_grpc_protocol_errors_total"), 3);
}

/// The error code of the GOAWAY the server sends on a connection that
/// sends `frames` after the preface and SETTINGS (`None`: none came).
fn goaway(addr: SocketAddr, frames: &[u8]) -> Option<u32> {
    let mut tcp = TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend_from_slice(frames);
    tcp.write_all(&out).expect("write");
    let mut buf = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let mut chunk = [0u8; 16384];
        match tcp.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => continue,
        }
        while let Some(f) = next_frame(&mut buf) {
            if f.kind == GOAWAY {
                let code = f.payload.get(4..8)?;
                return Some(u32::from_be_bytes([code[0], code[1], code[2], code[3]]));
            }
        }
    }
    None
}

#[test]
fn a_second_server_on_a_taken_port_does_not_start() {
    let first = Tollgate::start(RULES, &[]);
    let addr = first.addr.to_string();
    let second = run_briefly_as_given(
        &[
            "--rules",
            first.rules_path().to_str().expect("utf-8"),
            "--grpc-addr",
            &addr,
            "--admin-addr",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert!(!second.started, "{}", second.stdout);
    assert!(!second.success);
    assert!(
        second.stderr.contains(&addr)
            && second.stderr.contains("already in use")
            && second.stderr.contains("for gRPC (--grpc-addr)"),
        "{}",
        second.stderr
    );
    // The admin port too, named by its flag.
    let admin = first.admin.to_string();
    let third = run_briefly_as_given(
        &[
            "--rules",
            first.rules_path().to_str().expect("utf-8"),
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            &admin,
        ],
        &[],
    );
    assert!(!third.success);
    assert!(
        third.stderr.contains(&admin)
            && third.stderr.contains("already in use")
            && third.stderr.contains("choose another with --admin-addr"),
        "{}",
        third.stderr
    );
}
