//! The reference's stats through a statsd-exporter mapping, scraped back to
//! back, never hold up the health check (issue 33): the scrape runs off the
//! runtime that answers `/healthcheck`, and each stat name is mapped once.

use std::time::{Duration, Instant};

use crate::common::envoy::http;
use crate::common::redis::free_port;
use crate::common::{Tollgate, ask, request};

#[tokio::test(flavor = "multi_thread")]
async fn health_answers_at_once_while_a_heavy_mapping_is_scraped() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 2,000 regex mappings that match nothing: every new name walks them all.
    let mut mapping = String::from("mappings:\n");
    for i in 0..2_000 {
        mapping.push_str(&format!(
            "  - match: 'ratelimit\\.nothing{i}\\.(.*)'\n    match_type: regex\n    name: never{i}\n"
        ));
    }
    let path = dir.path().join("mapping.yaml");
    std::fs::write(&path, mapping).expect("write mapping");
    let mut rules = String::from("domain: d\ndescriptors:\n");
    for i in 0..100 {
        rules.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
        ));
    }
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let server = Tollgate::start(
        &rules,
        &[
            "--reference-metrics-addr",
            &addr,
            "--statsd-mapping",
            &path.to_string_lossy(),
        ],
    );
    let mut client = server.client().await;
    for i in 0..100 {
        ask(&mut client, request("d", &[&[(&format!("k{i}"), "v")]])).await;
    }
    let scrapes_addr: std::net::SocketAddr = addr.parse().expect("address");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut scrapes = 0u32;
            let mut first = None;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let started = Instant::now();
                let r = http(scrapes_addr, "GET", "/metrics", &[]).expect("scrape");
                assert_eq!(r.status, 200);
                first.get_or_insert(started.elapsed());
                scrapes += 1;
            }
            (scrapes, first)
        })
    };
    let mut slowest = Duration::ZERO;
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let started = Instant::now();
        let r = http(server.admin, "GET", "/healthcheck", &[]).expect("health");
        assert_eq!(r.status, 200);
        slowest = slowest.max(started.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (scrapes, first) = scraper.join().expect("scraper");
    eprintln!("{scrapes} scrapes (the first took {first:?}); the slowest health check {slowest:?}");
    assert!(scrapes >= 2, "back-to-back scrapes: {scrapes}");
    // 100 ms on a release build; a debug build under a parallel test run
    // gets five times that.
    assert!(
        slowest < Duration::from_millis(500),
        "health took {slowest:?}"
    );
}
