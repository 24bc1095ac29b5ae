//! The instances' shared views of who is limited are data from other
//! processes: a view dated ahead of Redis's clock, one above the size
//! bound, and one of an instance that stopped writing are not read (and
//! the last is dropped); counts from others are summed without wrapping.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::envoy::http;
use crate::common::redis::RedisServer;
use crate::common::{Tollgate, ask, request};

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
const VIEWS: &str = "tollgate:{limited}:views";
const WRITTEN: &str = "tollgate:{limited}:written";

/// Redis's clock, in ms.
fn redis_ms(redis: &RedisServer) -> u64 {
    let time = redis.cli(&["TIME"]);
    let mut parts = time
        .lines()
        .map(|l| l.trim().parse::<u64>().expect("a number"));
    let (s, us) = (parts.next().expect("s"), parts.next().expect("us"));
    s * 1000 + us / 1000
}

fn merged(server: &Tollgate) -> Value {
    let r = http(server.admin, "GET", "/limited?scope=merged", &[]).expect("admin answers");
    assert_eq!(r.status, 200, "{}", r.body);
    serde_json::from_str(&r.body).expect("json")
}

#[tokio::test]
async fn other_instances_views_are_bounded_dated_by_redis_and_dropped_when_silent() {
    let redis = RedisServer::start();
    let url = redis.url();
    let server = Tollgate::start(RULES, &["--store", "redis", "--redis-url", &url]);
    let mut client = server.client().await;
    for _ in 0..3 {
        ask(&mut client, request("api", &[&[("user", "ann")]])).await;
    }
    // This instance's own view, as it publishes it (within 5 s).
    let started = Instant::now();
    let own = loop {
        let fields = redis.cli(&["HKEYS", VIEWS]);
        if let Some(name) = fields.lines().map(str::trim).find(|l| !l.is_empty()) {
            break name.to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "never published"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let body = redis.cli(&["HGET", VIEWS, &own]);
    let mut forged: Value = serde_json::from_str(body.trim()).expect("a published view");
    // Another "instance" whose counts would wrap a u64 when summed.
    forged["view"]["rules"][0]["refused"] = Value::from(u64::MAX - 1);
    forged["view"]["rules"][0]["clients"][0]["refused"] = Value::from(u64::MAX - 1);
    let forged = forged.to_string();
    let now = redis_ms(&redis);
    for (name, at) in [
        ("big-counts", now),
        // Dated a day ahead of Redis: never recent, whatever the reader's clock.
        ("from-the-future", now + 86_400_000),
        // Silent for a minute: dropped at the next publish.
        ("gone", now - 60_000),
    ] {
        redis.cli(&["HSET", VIEWS, name, &forged]);
        redis.cli(&["HSET", WRITTEN, name, &at.to_string()]);
    }
    // Above the size bound (1 MiB), dated now: not read.
    redis.cli(&[
        "EVAL",
        "return redis.call('HSET', KEYS[1], 'huge', string.rep('x', tonumber(ARGV[1])))",
        "1",
        VIEWS,
        &(2u32 << 20).to_string(),
    ]);
    redis.cli(&["HSET", WRITTEN, "huge", &now.to_string()]);

    let view = merged(&server);
    assert_eq!(view["instances"], 2, "this one and big-counts only: {view}");
    let rule = &view["rules"][0];
    assert_eq!(
        rule["refused"],
        Value::from(u64::MAX),
        "saturated, not wrapped"
    );
    assert_eq!(rule["clients"][0]["refused"], Value::from(u64::MAX));

    // The silent instance's view is dropped by the next publish (this
    // instance publishes every 5 s while it has refusals).
    ask(&mut client, request("api", &[&[("user", "ann")]])).await;
    let started = Instant::now();
    while redis.cli(&["HEXISTS", VIEWS, "gone"]).trim() == "1" {
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "the silent instance's view stayed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(redis.cli(&["HEXISTS", WRITTEN, "gone"]).trim(), "0");
    assert_eq!(
        redis.cli(&["HEXISTS", VIEWS, "big-counts"]).trim(),
        "1",
        "a live one stays"
    );
}
