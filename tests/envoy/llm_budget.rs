//! A per-key token budget through a real Envoy 1.40 (envoy/llm-budget.yaml):
//! each call is checked against the budget at request time without spending
//! it, charged with the tokens its response reports when the response has
//! ended (`apply_on_stream_done` + a `hits_addend` format), and the next call
//! is refused once the budget is spent. The model API is a local stand-in
//! that answers with `x-usage-tokens` set from the request.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::Tollgate;
use crate::common::envoy::{Envoy, http};
use crate::common::redis::free_port;

/// examples/rules/llm-budget.yaml with small numbers.
const RULES: &str = "domain: llm
descriptors:
  - key: api_key
    rate_limits:
      - {name: tokens_per_minute, unit: minute, requests_per_unit: 100, algorithm: fixed_window, budget: true, failure_mode: deny}
      - {name: tokens_per_month, unit: month, calendar: true, requests_per_unit: 1000, budget: true, failure_mode: deny}
  - key: generic_key
    value: calls
    descriptors:
      - key: api_key
        rate_limit: {name: calls_per_second, unit: second, requests_per_unit: 50}
";

/// A model API stand-in: answers every request 200 with `x-usage-tokens`
/// copied from the request's `x-simulated-tokens` (none when absent).
fn model_api() -> SocketAddr {
    crate::common::upstream::Recorder::answering(|request| {
        let usage = crate::common::upstream::header(request, "x-simulated-tokens")
            .map(|t| ("x-usage-tokens".to_owned(), t.to_owned()));
        (Duration::ZERO, usage.into_iter().collect())
    })
    .addr
}

struct Egress {
    _envoy: Envoy,
    addr: SocketAddr,
}

fn egress(tollgate_port: u16, model: SocketAddr) -> Egress {
    let (envoy, addr) = egress_with(tollgate_port, model, &[]);
    Egress {
        _envoy: envoy,
        addr,
    }
}

/// envoy/llm-budget.yaml in front of `model` (plain HTTP on loopback), with
/// `more` replacements in its text; Envoy and its listener's address.
pub(crate) fn egress_with(
    tollgate_port: u16,
    model: SocketAddr,
    more: &[(&str, &str)],
) -> (Envoy, SocketAddr) {
    let (listen, admin) = (free_port(), free_port());
    let model_address = format!("{{ address: 127.0.0.1, port_value: {} }}", model.port());
    let mut replacements = vec![
        // The stand-in speaks plain HTTP on loopback.
        (
            "{ address: api.example.com, port_value: 443 }",
            model_address.as_str(),
        ),
        (
            "      transport_socket: { name: envoy.transport_sockets.tls, typed_config: { \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext, sni: api.example.com } }\n",
            "",
        ),
    ];
    replacements.extend_from_slice(more);
    let envoy = Envoy::start_replacing(
        "llm-budget.yaml",
        &[(10300, listen), (9904, admin), (8081, tollgate_port)],
        &replacements,
        admin,
    );
    (envoy, SocketAddr::from(([127, 0, 0, 1], listen)))
}

/// Tokens charged so far to one of the budget's limits (Tollgate's metrics).
fn charged(tollgate: &Tollgate, limit: &str) -> u64 {
    let series = format!(
        "ratelimit_service_rate_limit_within_limit{{domain=\"llm\",key1=\"api_key\",limit=\"{limit}\"}}"
    );
    crate::common::sample(&tollgate.metrics(), &series).map_or(0, |v| v as u64)
}

/// Waits until the stream-end charge has reached Tollgate: Envoy sends it
/// after the response, so the client may see the response first.
fn wait_for_charge(tollgate: &Tollgate, total: u64) {
    crate::common::wait_until(
        &format!("{total} tokens charged"),
        Duration::from_secs(10),
        || {
            let now = charged(tollgate, "tokens_per_minute");
            assert!(now <= total, "charged {now}, more than the {total} sent");
            now == total
        },
    );
}

fn call(g: &Egress, key: &str, tokens: Option<u64>) -> crate::common::envoy::Response {
    let tokens = tokens.map(|t| t.to_string());
    let mut headers = vec![("x-api-key", key)];
    if let Some(t) = &tokens {
        headers.push(("x-simulated-tokens", t.as_str()));
    }
    http(g.addr, "POST", "/v1/chat/completions", &headers).expect("egress answers")
}

#[test]
fn a_token_budget_is_spent_by_response_sizes_and_then_refuses() {
    let tollgate = Tollgate::start(RULES, &[]);
    let g = egress(tollgate.addr.port(), model_api());
    // 100 tokens a minute. The first call costs 60, reported by the response.
    let first = call(&g, "team-a", Some(60));
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("x-usage-tokens"), Some("60"), "{first:?}");
    wait_for_charge(&tollgate, 60);
    // The request-time check spent nothing: 40 are left, as the second
    // call's headers (from that check) say.
    let second = call(&g, "team-a", Some(30));
    assert_eq!(second.status, 200, "{second:?}");
    let ratelimit = second.header("ratelimit").unwrap_or("");
    assert!(
        ratelimit.contains("\"tokens_per_minute\";r=40"),
        "{second:?}"
    );
    wait_for_charge(&tollgate, 90);
    // 10 left: the call is admitted and its 50 tokens are charged in full.
    assert_eq!(call(&g, "team-a", Some(50)).status, 200);
    wait_for_charge(&tollgate, 140);
    // Spent: refused before it reaches the model API.
    let refused = call(&g, "team-a", Some(1));
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(
        refused.header("x-usage-tokens"),
        None,
        "never sent upstream"
    );
    assert!(
        refused
            .header("ratelimit")
            .is_some_and(|v| v.contains("\"tokens_per_minute\";r=0")),
        "{refused:?}"
    );
    // Another key has its own budget.
    assert_eq!(call(&g, "team-b", Some(5)).status, 200);
    wait_for_charge(&tollgate, 145);
    // The month counts every charge too: 1000 - 60 - 30 - 50 for team-a.
    assert_eq!(charged(&tollgate, "tokens_per_month"), 145);
}
