//! A gRPC load client for Tollgate (or any Envoy RLS): many distinct keys,
//! which h2load cannot send because it repeats one body.
//!
//! usage: tollgate-load [--addr HOST:PORT] [--connections N] [--streams M]
//!                      [--duration SECS] [--warmup SECS] [--keys K] [--domain D] [--key NAME]
//!
//! Prints decisions per second and latency percentiles.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

struct Options {
    addr: String,
    connections: usize,
    streams: usize,
    duration: Duration,
    warmup: Duration,
    keys: usize,
    domain: String,
    key: String,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        addr: "127.0.0.1:8081".into(),
        connections: 16,
        streams: 4,
        duration: Duration::from_secs(8),
        warmup: Duration::from_secs(2),
        keys: 100_000,
        domain: "api".into(),
        key: "remote_address".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--addr" => o.addr = value()?,
            "--connections" => o.connections = num(value()?)? as usize,
            "--streams" => o.streams = num(value()?)? as usize,
            "--duration" => o.duration = Duration::from_secs(num(value()?)?),
            "--warmup" => o.warmup = Duration::from_secs(num(value()?)?),
            "--keys" => o.keys = num(value()?)?.max(1) as usize,
            "--domain" => o.domain = value()?,
            "--key" => o.key = value()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(o)
}

fn main() {
    let options = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("tollgate-load: {e}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tollgate-load: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(options)) {
        eprintln!("tollgate-load: {e}");
        std::process::exit(1);
    }
}

async fn run(o: Options) -> Result<(), Box<dyn std::error::Error>> {
    let requests: std::sync::Arc<Vec<RateLimitRequest>> = std::sync::Arc::new(
        (0..o.keys)
            .map(|i| RateLimitRequest {
                domain: o.domain.clone(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: o.key.clone(),
                        value: format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255),
                    }],
                    ..Default::default()
                }],
                hits_addend: 0,
            })
            .collect(),
    );
    let start = Instant::now();
    let measure_from = start + o.warmup;
    let end = measure_from + o.duration;
    let mut tasks = Vec::new();
    for c in 0..o.connections {
        let client = RateLimitServiceClient::connect(format!("http://{}", o.addr)).await?;
        for s in 0..o.streams {
            let mut client = client.clone();
            let requests = requests.clone();
            let mut i = (c * o.streams + s) * 7919;
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(1 << 16);
                let mut errors = 0u64;
                loop {
                    let sent = Instant::now();
                    if sent >= end {
                        break;
                    }
                    i = (i + 1) % requests.len();
                    let ok = client.should_rate_limit(requests[i].clone()).await.is_ok();
                    if sent >= measure_from {
                        if ok {
                            latencies.push(sent.elapsed().as_micros() as u32);
                        } else {
                            errors += 1;
                        }
                    }
                }
                (latencies, errors)
            }));
        }
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (l, e) = t.await?;
        all.extend(l);
        errors += e;
    }
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "decisions/s: {:.0}  (ok {}, errors {}, {} keys, {} connections x {} streams, {} s)",
        all.len() as f64 / o.duration.as_secs_f64(),
        all.len(),
        errors,
        o.keys,
        o.connections,
        o.streams,
        o.duration.as_secs()
    );
    println!(
        "latency us: p50 {}  p99 {}  p99.9 {}",
        pct(0.5),
        pct(0.99),
        pct(0.999)
    );
    Ok(())
}
