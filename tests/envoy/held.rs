//! In-flight caps and reservations through a real Envoy 1.40
//! (envoy/llm-budget.yaml with the rate_limits of docs/rules.md): the
//! request-time call holds the request's `x-request-id`, the stream-end
//! call (`apply_on_stream_done`) releases or settles it. The upstream
//! holds each request open as long as its `x-delay-ms` asks.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::Tollgate;
use crate::common::envoy::{Envoy, http};

const RULES: &str = "domain: llm
descriptors:
  - key: api_key
    in_flight: {limit: 2, max_hold_seconds: 4}
  - key: tenant
    rate_limit: {unit: day, unit_multiplier: 3650, requests_per_unit: 100, algorithm: fixed_window, budget: true, reserve: true}
";

/// The filter's rate_limits: a slot per key, and a reservation of the
/// request's `x-max-tokens` per tenant, settled at the response's
/// `x-usage-tokens`.
const RATE_LIMITS: &str = "rate_limits:
                        - actions:
                            - request_headers: { header_name: x-api-key, descriptor_key: api_key, skip_if_absent: true }
                            - request_headers: { header_name: x-request-id, descriptor_key: request_id }
                        - actions:
                            - request_headers: { header_name: x-api-key, descriptor_key: api_key, skip_if_absent: true }
                            - request_headers: { header_name: x-request-id, descriptor_key: release }
                          apply_on_stream_done: true
                        - actions:
                            - request_headers: { header_name: x-tenant, descriptor_key: tenant, skip_if_absent: true }
                            - request_headers: { header_name: x-request-id, descriptor_key: request_id }
                          hits_addend: { format: \"%REQ(x-max-tokens)%\" }
                        - actions:
                            - request_headers: { header_name: x-tenant, descriptor_key: tenant, skip_if_absent: true }
                            - request_headers: { header_name: x-request-id, descriptor_key: settle }
                          apply_on_stream_done: true
                          hits_addend: { format: \"%RESP(x-usage-tokens)%\" }
";

/// An upstream that answers after `x-delay-ms`, with `x-usage-tokens` from
/// `x-used-tokens`.
fn slow_api() -> SocketAddr {
    crate::common::upstream::Recorder::answering(|request| {
        let value = |name| crate::common::upstream::header(request, name);
        let delay = value("x-delay-ms")
            .and_then(|d| d.parse().ok())
            .unwrap_or(0);
        let usage = value("x-used-tokens").map(|t| ("x-usage-tokens".to_owned(), t.to_owned()));
        (Duration::from_millis(delay), usage.into_iter().collect())
    })
    .addr
}

/// The file's own rate_limits block, to be replaced whole.
fn original_rate_limits() -> String {
    let text = std::fs::read_to_string(crate::common::envoy::config_path("llm-budget.yaml"))
        .expect("llm-budget.yaml");
    let start = text.find("rate_limits:").expect("rate_limits");
    let end = text[start..]
        .find("# Fail closed")
        .expect("after rate_limits")
        + start;
    let block = &text[start..end];
    // Up to the indentation of the comment's line.
    block[..block.rfind('\n').expect("a line") + 1].to_owned()
}

/// envoy/llm-budget.yaml with this test's rate_limits, in front of `api`.
fn gateway(tollgate_port: u16, api: SocketAddr) -> (Envoy, SocketAddr) {
    let original = original_rate_limits();
    crate::llm_budget::egress_with(tollgate_port, api, &[(&original, RATE_LIMITS)])
}

fn status(addr: SocketAddr, headers: &[(&str, &str)]) -> u16 {
    http(addr, "POST", "/v1/chat/completions", headers)
        .expect("gateway answers")
        .status
}

/// Requests `n` held open for `ms`, each on its own thread.
fn hold_open(
    addr: SocketAddr,
    key: &'static str,
    n: usize,
    ms: u64,
) -> Vec<std::thread::JoinHandle<u16>> {
    (0..n)
        .map(|_| {
            std::thread::spawn(move || {
                let delay = ms.to_string();
                status(addr, &[("x-api-key", key), ("x-delay-ms", &delay)])
            })
        })
        .collect()
}

#[test]
fn in_flight_slots_are_held_while_requests_run_and_freed_by_their_own_stream_end() {
    let tollgate = Tollgate::start(RULES, &[]);
    let (_envoy, addr) = gateway(tollgate.addr.port(), slow_api());
    let running = hold_open(addr, "k1", 2, 2_500);
    std::thread::sleep(Duration::from_millis(800));
    // Two in progress: refused, and their stream ends free nothing.
    for i in 0..3 {
        assert_eq!(status(addr, &[("x-api-key", "k1")]), 429, "refused {i}");
    }
    // Another key has its own slots.
    assert_eq!(status(addr, &[("x-api-key", "k2")]), 200);
    for r in running {
        assert_eq!(r.join().expect("held request"), 200);
    }
    // Both released by their stream ends: two slots again, not more.
    crate::common::wait_until("the releases", Duration::from_secs(5), || {
        status(addr, &[("x-api-key", "k1")]) == 200
    });
    let again = hold_open(addr, "k1", 2, 1_500);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        status(addr, &[("x-api-key", "k1")]),
        429,
        "the refused ones freed none"
    );
    for r in again {
        assert_eq!(r.join().expect("held request"), 200);
    }
}

#[test]
fn slots_of_a_killed_envoy_come_back_after_max_hold_seconds() {
    let tollgate = Tollgate::start(RULES, &[]);
    let api = slow_api();
    let (envoy, addr) = gateway(tollgate.addr.port(), api);
    let _lost = hold_open(addr, "k1", 2, 20_000);
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(status(addr, &[("x-api-key", "k1")]), 429);
    let killed = Instant::now();
    drop(envoy); // killed mid-request: no stream-end call ever comes
    let (_envoy, addr) = gateway(tollgate.addr.port(), api);
    if killed.elapsed() < Duration::from_secs(3) {
        assert_eq!(status(addr, &[("x-api-key", "k1")]), 429, "still held");
    }
    crate::common::wait_until("the slots lapse", Duration::from_secs(10), || {
        status(addr, &[("x-api-key", "k1")]) == 200
    });
    assert!(
        killed.elapsed() >= Duration::from_secs(3),
        "held max_hold_seconds"
    );
}

#[test]
fn reservations_admit_what_fits_and_settle_to_the_real_costs() {
    let tollgate = Tollgate::start(RULES, &[]);
    let (_envoy, addr) = gateway(tollgate.addr.port(), slow_api());
    // 20 concurrent streams of max_tokens 10 against a budget of 100: 10
    // reservations fit. Each really uses 3.
    let calls: Vec<_> = (0..20)
        .map(|_| {
            std::thread::spawn(move || {
                status(
                    addr,
                    &[
                        ("x-tenant", "t"),
                        ("x-max-tokens", "10"),
                        ("x-used-tokens", "3"),
                        ("x-delay-ms", "1500"),
                    ],
                )
            })
        })
        .collect();
    let codes: Vec<u16> = calls.into_iter().map(|c| c.join().expect("call")).collect();
    assert_eq!(codes.iter().filter(|&&c| c == 200).count(), 10, "{codes:?}");
    assert_eq!(codes.iter().filter(|&&c| c == 429).count(), 10, "{codes:?}");
    // Settled: 10 x 3 spent, 70 left; the refused ones refunded nothing.
    // (A settlement of nothing for an ID never seen reads what is left.)
    let left = || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let mut client = tollgate.client().await;
            let mut probe =
                crate::common::request("llm", &[&[("tenant", "t"), ("settle", "probe")]]);
            probe.descriptors[0].hits_addend =
                Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
            crate::common::ask(&mut client, probe).await.statuses[0].limit_remaining
        })
    };
    crate::common::wait_until("the settlements", Duration::from_secs(10), || left() == 70);
}
