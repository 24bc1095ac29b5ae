//! The view of who is limited under a flood: pages of `/limited`, a full
//! view read in a loop while decisions go on, and a 128-descriptor refusal
//! counted as one step.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::envoy::http;
use crate::common::{Tollgate, ask, request};

/// `n` rules, `k0` .. `k{n-1}`, each refusing everything.
fn rules(n: usize) -> String {
    let mut out = String::from("domain: api\ndescriptors:\n");
    for i in 0..n {
        out.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{unit: hour, requests_per_unit: 0}}\n"
        ));
    }
    out
}

fn get(server: &Tollgate, path: &str) -> (u16, Value, Duration) {
    let started = Instant::now();
    let r = http(server.admin, "GET", path, &[]).expect("admin answers");
    let took = started.elapsed();
    let body = serde_json::from_str(&r.body).unwrap_or(Value::Null);
    (r.status, body, took)
}

#[tokio::test]
async fn limited_pages_and_reading_a_full_view_never_holds_decisions() {
    let server = Tollgate::start(&rules(200), &[]);
    let mut client = server.client().await;
    // A full view: 200 rules x 32 clients, each request with a second
    // descriptor of 30 entries (kept with the client, cut to its bytes).
    let wide: Vec<(String, String)> = (0..30)
        .map(|i| (format!("entry{i}"), "x".repeat(20)))
        .collect();
    let wide: Vec<(&str, &str)> = wide.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    for c in 0..32 {
        for r in 0..200 {
            let (key, value) = (format!("k{r}"), format!("client{c}"));
            let answer = ask(&mut client, request("api", &[&[(&key, &value)], &wide])).await;
            assert_eq!(answer.overall_code, 2);
        }
    }
    // Pages: 50 rules by default, the total and where the next page starts.
    let (status, page, _) = get(&server, "/limited");
    assert_eq!(status, 200);
    assert_eq!(page["rules"].as_array().map(Vec::len), Some(50));
    assert_eq!(page["total_rules"], 200);
    assert_eq!(page["next_offset"], 50);
    let (_, last, _) = get(&server, "/limited?offset=180&limit=50");
    assert_eq!(last["rules"].as_array().map(Vec::len), Some(20));
    assert!(last.get("next_offset").is_none(), "{}", last["next_offset"]);
    for bad in [
        "/limited?limit=0",
        "/limited?limit=1001",
        "/limited?offset=x",
    ] {
        assert_eq!(get(&server, bad).0, 400, "{bad}");
    }
    // The whole view, read in a loop, while decisions are timed.
    let admin = server.admin;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut reads = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let started = Instant::now();
                let r = http(admin, "GET", "/limited?limit=1000", &[]).expect("admin answers");
                assert_eq!(r.status, 200);
                reads.push((started.elapsed(), r.body.len()));
            }
            reads
        })
    };
    let mut latencies = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let asked = Instant::now();
        ask(&mut client, request("api", &[&[("k7", "someone")]])).await;
        latencies.push(asked.elapsed());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().expect("reader");
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    let slowest_read = reads.iter().map(|r| r.0).max().unwrap_or_default();
    eprintln!(
        "{} decisions, p99 {p99:?}, worst {:?}; {} full reads of {} bytes, the slowest {slowest_read:?} (debug build)",
        latencies.len(),
        latencies.last().copied().unwrap_or_default(),
        reads.len(),
        reads.first().map_or(0, |r| r.1)
    );
    assert!(reads.len() >= 3, "the view was read while deciding");
    assert!(
        p99 < Duration::from_millis(20),
        "p99 {p99:?} while the view was read"
    );
}
