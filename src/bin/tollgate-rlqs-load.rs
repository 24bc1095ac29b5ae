//! A load client for the quota service (RLQS): many streams, each sending
//! usage reports as fast as the answers come back, as many Envoys would
//! (each Envoy sends one every 5 s; this sends the next as soon as the last
//! is answered).
//!
//! usage: tollgate-rlqs-load [--addr HOST:PORT] [--streams N] [--buckets B]
//!                           [--keys K] [--duration SECS] [--warmup SECS] [--domain D]
//!
//! Each report carries B buckets `{api_key: kI}`, I taken in turn from K keys,
//! so streams share buckets. Prints reports and bucket usages per second.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration as PbDuration;

struct Options {
    addr: String,
    streams: usize,
    buckets: usize,
    keys: usize,
    duration: Duration,
    warmup: Duration,
    domain: String,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        addr: "127.0.0.1:8081".into(),
        streams: 64,
        buckets: 10,
        keys: 1000,
        duration: Duration::from_secs(8),
        warmup: Duration::from_secs(2),
        domain: "rlqs".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: '{v}' is not a number"))
        };
        match flag.as_str() {
            "--addr" => o.addr = value()?,
            "--streams" => o.streams = number(value()?)?.max(1),
            "--buckets" => o.buckets = number(value()?)?.max(1),
            "--keys" => o.keys = number(value()?)?.max(1),
            "--duration" => o.duration = Duration::from_secs(number(value()?)? as u64),
            "--warmup" => o.warmup = Duration::from_secs(number(value()?)? as u64),
            "--domain" => o.domain = value()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(o)
}

fn report(o: &Options, stream: usize, round: usize) -> RateLimitQuotaUsageReports {
    let first = (stream * o.buckets + round) % o.keys;
    RateLimitQuotaUsageReports {
        domain: o.domain.clone(),
        bucket_quota_usages: (0..o.buckets)
            .map(|j| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [("api_key".to_string(), format!("k{}", (first + j) % o.keys))]
                        .into_iter()
                        .collect(),
                }),
                time_elapsed: Some(PbDuration {
                    seconds: 5,
                    nanos: 0,
                }),
                num_requests_allowed: 40,
                num_requests_denied: 10,
            })
            .collect(),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let o = match parse() {
        Ok(o) => Arc::new(o),
        Err(e) => {
            eprintln!("tollgate-rlqs-load: {e}");
            std::process::exit(2);
        }
    };
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for stream in 0..o.streams {
        let (o, answered, failed) = (o.clone(), answered.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            let run = async {
                let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", o.addr))
                    .await
                    .map_err(|e| e.to_string())?;
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                let outbound = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|r| (r, rx))
                });
                tx.send(report(&o, stream, 0))
                    .await
                    .map_err(|e| e.to_string())?;
                let mut inbound = client
                    .stream_rate_limit_quotas(outbound)
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                let mut round = 1;
                while inbound
                    .message()
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some()
                {
                    answered.fetch_add(1, Ordering::Relaxed);
                    tx.send(report(&o, stream, round))
                        .await
                        .map_err(|e| e.to_string())?;
                    round += 1;
                }
                Ok::<(), String>(())
            };
            if let Err(e) = run.await
                && !failed.swap(true, Ordering::Relaxed)
            {
                eprintln!("tollgate-rlqs-load: stream {stream}: {e}");
            }
        }));
    }
    tokio::time::sleep(o.warmup).await;
    let before = answered.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(o.duration).await;
    let reports = answered.load(Ordering::Relaxed) - before;
    let seconds = started.elapsed().as_secs_f64();
    for task in tasks {
        task.abort();
    }
    if failed.load(Ordering::Relaxed) {
        std::process::exit(1);
    }
    let per_second = reports as f64 / seconds;
    println!(
        "{} streams, {} buckets per report over {} keys: {:.0} reports/s, {:.0} bucket usages/s",
        o.streams,
        o.buckets,
        o.keys,
        per_second,
        per_second * o.buckets as f64
    );
}
