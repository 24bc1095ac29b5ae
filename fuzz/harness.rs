//! What each fuzz target does with its input, shared by the libFuzzer
//! targets (`fuzz/fuzz_targets/*.rs`) and by `tests/api/fuzz_corpus.rs`, which
//! replays the saved corpus and every crash found on a stable toolchain in
//! CI. Each function panics when an invariant breaks.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};
use prost::Message;
use tollgate::clock::{Clock, ManualClock, NANOS_PER_SEC, Nanos};
use tollgate::limiter::{Decision, Descriptor, LimitOverride, Limiter, LimiterOptions, Request};
use tollgate::rules::{LoadOptions, RuleSet, Unit, load_sources};
use tollgate::store::{MemoryStore, MemoryStoreOptions, Store};

/// The rules the request targets run against: every algorithm, small limits
/// (so they are reached), large ones, a limit of zero and an unlimited key.
pub(crate) const RULES: &str = "domain: f
descriptors:
  - key: fw
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: fixed_window}
  - key: fwd
    rate_limit: {unit: day, requests_per_unit: 4000000000, algorithm: fixed_window}
  - key: sw
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: sliding_window}
  - key: swm
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: token_bucket, burst: 2}
  - key: tby
    rate_limit: {unit: year, requests_per_unit: 1, algorithm: token_bucket, burst: 50}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: org
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 2, algorithm: fixed_window}
";

/// Keys the structured target draws from (`nope` matches no rule).
const KEYS: [&str; 10] = [
    "fw", "fwd", "sw", "swm", "tb", "tby", "zero", "free", "org", "nope",
];
const VALUES: [&str; 3] = ["a", "b|user=a", "{c}"];

/// Parsed once: loading YAML for every input would take most of the
/// fuzzers' time.
static PARSED: std::sync::LazyLock<RuleSet> = std::sync::LazyLock::new(|| {
    load_sources(
        &[(PathBuf::from("f.yaml"), RULES.into())],
        &LoadOptions::default(),
    )
    .expect("the fuzz rules load")
});

fn rules() -> RuleSet {
    PARSED.clone()
}

fn limiter(clock: &ManualClock) -> Limiter {
    Limiter::new(
        rules(),
        Store::Memory(MemoryStore::new(MemoryStoreOptions::default())),
        Arc::new(clock.clone()),
        LimiterOptions::default(),
    )
}

fn decide(limiter: &Limiter, request: &Request<'_>) -> Option<Decision> {
    limiter
        .decide_now(request)
        .expect("the memory store decides at once")
        .ok()
}

/// Rule files: loading and compiling never panics; what loads can be listed.
pub(crate) fn rules_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(set) = load_sources(
        &[(PathBuf::from("fuzz.yaml"), text.into())],
        &LoadOptions::default(),
    ) {
        let _ = set.to_string();
    } else if let Err(errors) = load_sources(
        &[(PathBuf::from("fuzz.yaml"), text.into())],
        &LoadOptions::default(),
    ) {
        // Every error names the file.
        for e in &errors.0 {
            assert!(e.to_string().contains("fuzz.yaml"), "{e}");
        }
    }
}

/// Arbitrary protobuf bytes as a RateLimitRequest, through the limiter.
pub(crate) fn request_bytes(data: &[u8]) {
    let Ok(request) =
        envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest::decode(data)
    else {
        return;
    };
    let clock = ManualClock::new(1_700_000_000 * NANOS_PER_SEC);
    let limiter = limiter(&clock);
    if let Ok(domain) = tollgate::to_domain(&request) {
        let _ = limiter.decide_now(&domain);
        let _ = limiter.decide_now(&domain);
    }
}

/// An arbitrary `/json` body, through the limiter.
pub(crate) fn json_body(data: &[u8]) {
    let Ok(request) = tollgate::request_from_json(data) else {
        return;
    };
    let clock = ManualClock::new(1_700_000_000 * NANOS_PER_SEC);
    let limiter = limiter(&clock);
    if let Ok(domain) = tollgate::to_domain(&request) {
        let _ = limiter.decide_now(&domain);
    }
}

/// A counter of the fuzz rules: key, value and, for `org.user`, the user.
type Counter = (String, String, Option<String>);

#[derive(Debug, Arbitrary)]
struct Step {
    /// Milliseconds to move the clock first.
    gap_ms: u16,
    /// Rarely, a jump of this many hours.
    jump_hours: Option<u8>,
    request_hits: u32,
    descriptors: Vec<Asked>,
}

#[derive(Debug, Arbitrary)]
struct Asked {
    key: u8,
    value: u8,
    /// A second entry (`user`), for the nested rule.
    user: Option<u8>,
    hits: Option<u64>,
    limit: Option<(u32, u8)>,
}

/// A sequence of structured requests with clock jumps, through the limiter,
/// checking after each one:
/// - a refused request changed no counter (the same descriptors, asked as
///   checks before and after, report the same remaining counts);
/// - per counter, the admitted hits never exceed what the algorithm allows
///   (fixed and sliding window: the limit per window; token bucket: the
///   burst plus what refilled since).
pub(crate) fn request_sequence(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(steps) = Vec::<Step>::arbitrary(&mut u) else {
        return;
    };
    let clock = ManualClock::new(1_700_000_000 * NANOS_PER_SEC);
    let limiter = limiter(&clock);
    // Counter (key, value, user) -> admitted (time, hits).
    let mut admitted: HashMap<Counter, Vec<(Nanos, u64)>> = HashMap::new();
    for step in steps.iter().take(64) {
        let jump = step
            .jump_hours
            .map_or(0, |h| u64::from(h) * 3600 * NANOS_PER_SEC);
        clock.set(clock.now() + u64::from(step.gap_ms) * 1_000_000 + jump);
        let asked: Vec<&Asked> = step.descriptors.iter().take(8).collect();
        if asked.is_empty() {
            continue;
        }
        let users: Vec<String> = asked
            .iter()
            .map(|a| a.user.map_or(String::new(), |u| format!("u{}", u % 3)))
            .collect();
        let build = |checks: bool| Request {
            domain: "f",
            descriptors: asked
                .iter()
                .zip(&users)
                .map(|(a, user)| {
                    let mut entries: smallvec::SmallVec<[(&str, &str); 4]> =
                        smallvec::SmallVec::new();
                    entries.push((
                        KEYS[usize::from(a.key) % KEYS.len()],
                        VALUES[usize::from(a.value) % VALUES.len()],
                    ));
                    if a.user.is_some() {
                        entries.push(("user", user.as_str()));
                    }
                    Descriptor {
                        entries,
                        hits_addend: if checks { Some(0) } else { a.hits },
                        limit_override: a.limit.map(|(rpu, unit)| LimitOverride {
                            requests_per_unit: rpu,
                            unit: Unit::ALL[usize::from(unit) % Unit::ALL.len()],
                        }),
                    }
                })
                .collect(),
            hits_addend: step.request_hits,
        };
        let request = build(false);
        let before = decide(&limiter, &build(true));
        let Some(decision) = decide(&limiter, &request) else {
            continue;
        };
        let after = decide(&limiter, &build(true));
        if decision.over_limit {
            let remaining = |d: &Option<Decision>| {
                d.as_ref()
                    .map(|d| d.statuses.iter().map(|s| s.remaining).collect::<Vec<_>>())
            };
            assert_eq!(
                remaining(&before),
                remaining(&after),
                "a refused request spent budget: {step:?}"
            );
            continue;
        }
        let now = clock.now();
        for ((a, user), status) in asked.iter().zip(&users).zip(&decision.statuses) {
            if a.limit.is_some() || status.limit.is_none() {
                continue;
            }
            let hits = a.hits.unwrap_or(u64::from(step.request_hits.max(1)));
            if hits == 0 {
                continue;
            }
            let key = KEYS[usize::from(a.key) % KEYS.len()].to_owned();
            let value = VALUES[usize::from(a.value) % VALUES.len()].to_owned();
            let user = a.user.map(|_| user.clone());
            admitted
                .entry((key, value, user))
                .or_default()
                .push((now, hits));
        }
    }
    for ((key, _, user), log) in &admitted {
        check_bound(if user.is_some() { "org.user" } else { key }, log);
    }
}

/// The admitted hits of one counter stay within its rule's limit.
fn check_bound(rule: &str, log: &[(Nanos, u64)]) {
    let (limit, period, algorithm, burst): (u64, Nanos, &str, u64) = match rule {
        "fw" => (3, NANOS_PER_SEC, "fixed", 0),
        "fwd" => (4_000_000_000, 86_400 * NANOS_PER_SEC, "fixed", 0),
        "sw" => (3, NANOS_PER_SEC, "sliding", 0),
        "swm" => (5, 60 * NANOS_PER_SEC, "sliding", 0),
        "tb" => (4, NANOS_PER_SEC, "bucket", 2),
        "tby" => (1, 365 * 86_400 * NANOS_PER_SEC, "bucket", 50),
        "org.user" => (2, NANOS_PER_SEC, "fixed", 0),
        "zero" => {
            assert!(log.is_empty(), "a limit of zero admitted {log:?}");
            return;
        }
        _ => return,
    };
    match algorithm {
        "fixed" | "sliding" => {
            let mut per_window: HashMap<u64, u64> = HashMap::new();
            for &(t, hits) in log {
                *per_window.entry(t / period).or_default() += hits;
            }
            for (window, total) in per_window {
                assert!(total <= limit, "{rule}: {total} hits in window {window}");
            }
        }
        _ => {
            // GCRA in microseconds: hits * interval <= burst * interval + elapsed.
            let interval = u128::from(period / 1_000 / limit);
            for (i, &(t1, _)) in log.iter().enumerate() {
                let mut total = 0u128;
                for &(t2, hits) in &log[i..] {
                    total += u128::from(hits);
                    let elapsed = u128::from((t2 - t1) / 1_000);
                    assert!(
                        total * interval <= u128::from(burst) * interval + elapsed,
                        "{rule}: {total} hits between {t1} and {t2}"
                    );
                }
            }
        }
    }
}
