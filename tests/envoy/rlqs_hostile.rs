//! The quota service (RLQS) against hostile clients, over real HTTP/2 to the
//! real binary: streams that send only a message prefix, streams that never
//! read their answers, and ShouldRateLimit's latency beside 10,000 quota
//! streams. The tests of this binary run one at a time (they measure
//! memory and latency).

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]
#![allow(missing_docs)]

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::common::{Tollgate, rss, wait_until};
use bytes::Bytes;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};

const RULES: &str = "domain: rlqs
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 20}
";

/// Held by each test: they run one at a time.
fn alone() -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

const RLQS_PATH: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// A gRPC frame: uncompressed, with its length.
fn grpc_frame(message: &[u8]) -> Bytes {
    let mut out = vec![0u8];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

type Chunks = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<Frame<Bytes>, std::convert::Infallible>> + Send>,
>;

/// An HTTP/2 connection to `addr` (the client's stream window `window`).
async fn h2(
    addr: SocketAddr,
    window: u32,
) -> hyper::client::conn::http2::SendRequest<StreamBody<Chunks>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(window)
        .handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

fn quota_call(addr: SocketAddr, body: Chunks) -> http::Request<StreamBody<Chunks>> {
    http::Request::post(format!("http://{addr}{RLQS_PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(StreamBody::new(body))
        .expect("request")
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::await_holding_lock)] // the guard only orders this binary's tests
async fn streams_that_send_only_a_prefix_hold_no_reserved_memory_and_time_out() {
    let _alone = alone();
    let tollgate = Tollgate::start(RULES, &["--rlqs-idle-timeout", "3s"]);
    let before = rss(tollgate.pid());
    // 2,000 streams, each sending a 5-byte prefix that declares 120 KB
    // and nothing more (before: the 120 KB were reserved at once).
    let prefix = {
        let mut p = vec![0u8];
        p.extend_from_slice(&(120_000u32).to_be_bytes());
        Bytes::from(p)
    };
    let mut held = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..10 {
        let mut sender = h2(tollgate.addr, 65_535).await;
        for _ in 0..200 {
            held.push(stream_of(&mut sender, tollgate.addr, vec![prefix.clone()]).await);
        }
        senders.push(sender);
    }
    let t = &tollgate;
    tokio::task::block_in_place(|| {
        wait_until("2,000 open streams", Duration::from_secs(20), || {
            t.metric("tollgate_rlqs_streams") == 2_000
        })
    });
    let grown = rss(tollgate.pid()).saturating_sub(before);
    eprintln!(
        "2,000 prefix-only streams: RSS grew {} MB",
        grown / 1_000_000
    );
    assert!(
        grown < 120_000_000,
        "RSS grew {grown} bytes for 2,000 streams (2,000 x 120 KB would be 240 MB)"
    );
    // They send no report: after --rlqs-idle-timeout they are ended.
    tokio::task::block_in_place(|| {
        wait_until(
            "the silent streams to be ended",
            Duration::from_secs(15),
            || t.metric("tollgate_rlqs_streams") == 0,
        )
    });
    for h in held {
        h.abort();
    }
    drop(senders);
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::await_holding_lock)] // the guard only orders this binary's tests
async fn a_stream_that_never_reads_its_answers_is_ended_at_its_byte_bound() {
    let _alone = alone();
    let tollgate = Tollgate::start(RULES, &["--rlqs-max-queued-bytes", "65536"]);
    // A client window of zero: no answer can reach it.
    let mut sender = h2(tollgate.addr, 0).await;
    let (tx, rx) =
        tokio::sync::mpsc::unbounded_channel::<Result<Frame<Bytes>, std::convert::Infallible>>();
    let body: Chunks = Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    }));
    sender.ready().await.expect("ready");
    let call = tokio::spawn(sender.send_request(quota_call(tollgate.addr, body)));
    // Reports of 10 new buckets each with 4 KB values: each answer is over
    // 40 KB, and what waits (one action per bucket) grows by as much.
    for round in 0..50u64 {
        let usages = (0..10)
            .map(|i| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [(
                        "api_key".to_string(),
                        format!("{round}-{i}-{}", "x".repeat(4_000)),
                    )]
                    .into(),
                }),
                time_elapsed: Some(PbDuration {
                    seconds: 1,
                    nanos: 0,
                }),
                num_requests_allowed: round,
                num_requests_denied: 0,
            })
            .collect();
        let report = RateLimitQuotaUsageReports {
            domain: "rlqs".into(),
            bucket_quota_usages: usages,
        };
        if tx
            .send(Ok(Frame::data(grpc_frame(&prost::Message::encode_to_vec(
                &report,
            )))))
            .is_err()
        {
            break;
        }
    }
    let t = &tollgate;
    tokio::task::block_in_place(|| {
        wait_until("the stream to be ended", Duration::from_secs(10), || {
            t.metric("tollgate_rlqs_streams_ended_total") == 1
                && t.metric("tollgate_rlqs_streams") == 0
        })
    });
    call.abort();
}

/// The 99th percentile of `samples`.
fn p99(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() * 99 / 100]
}

/// ShouldRateLimit latencies of `n` calls in a row.
async fn latencies(tollgate: &Tollgate, n: usize) -> Vec<Duration> {
    let mut client = tollgate.client().await;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        crate::common::ask(
            &mut client,
            crate::common::request("rlqs", &[&[("api_key", &format!("user{}", i % 50))]]),
        )
        .await;
        out.push(started.elapsed());
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::await_holding_lock)] // the guard only orders this binary's tests
async fn ten_thousand_quota_streams_leave_should_rate_limit_latency_alone() {
    let _alone = alone();
    let tollgate = Tollgate::start(RULES, &[]);
    latencies(&tollgate, 200).await;
    let idle = p99(latencies(&tollgate, 2_000).await);
    // 10,000 streams (50 connections of 200), each reporting the same four
    // buckets: 40,000 pairs for the tick to walk every second.
    let report = RateLimitQuotaUsageReports {
        domain: "rlqs".into(),
        bucket_quota_usages: (0..4)
            .map(|i| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [("api_key".to_string(), format!("shared{i}"))].into(),
                }),
                time_elapsed: Some(PbDuration {
                    seconds: 5,
                    nanos: 0,
                }),
                num_requests_allowed: 5,
                num_requests_denied: 0,
            })
            .collect(),
    };
    let message = grpc_frame(&prost::Message::encode_to_vec(&report));
    let mut held = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..50 {
        let mut sender = h2(tollgate.addr, 65_535).await;
        for _ in 0..200 {
            // A report at once and every 5 s, as Envoy sends them.
            let message = message.clone();
            let body: Chunks = Box::pin(futures_util::stream::unfold(0u32, move |n| {
                let message = message.clone();
                async move {
                    if n > 0 {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                    Some((Ok(Frame::data(message)), n + 1))
                }
            }));
            held.push(open_stream(&mut sender, tollgate.addr, body).await);
        }
        senders.push(sender);
    }
    let t = &tollgate;
    tokio::task::block_in_place(|| {
        wait_until("10,000 open streams", Duration::from_secs(60), || {
            let (streams, pairs) = (
                t.metric("tollgate_rlqs_streams"),
                t.metric("tollgate_rlqs_pairs"),
            );
            streams == 10_000 && pairs == 40_000
        })
    });
    let cpu = |pid: u32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .expect("fields")
            .split_whitespace()
            .collect();
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
    };
    // Steady state: the streams' first reports are in; every stream reports
    // again every 5 s (2,000 reports a second) and the tick walks them all.
    let c0 = cpu(tollgate.pid());
    tokio::time::sleep(Duration::from_secs(5)).await;
    eprintln!(
        "the quota service's steady state took {} CPU ticks (1/100 s) in 5 s",
        cpu(tollgate.pid()) - c0
    );
    let busy = p99(latencies(&tollgate, 2_000).await);
    eprintln!("ShouldRateLimit p99: {idle:?} idle, {busy:?} with 10,000 quota streams");
    assert!(
        busy <= idle * 2 + Duration::from_millis(1),
        "p99 {busy:?} with 10,000 quota streams against {idle:?} without"
    );
    for h in held {
        h.abort();
    }
    drop(senders);
}

/// One report frame of `usages` (one second of usage each).
fn report_frame(usages: Vec<BucketQuotaUsage>) -> Bytes {
    grpc_frame(&prost::Message::encode_to_vec(
        &RateLimitQuotaUsageReports {
            domain: "rlqs".into(),
            bucket_quota_usages: usages,
        },
    ))
}

fn one_usage(value: String) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: [("api_key".to_string(), value)].into(),
        }),
        time_elapsed: Some(PbDuration {
            seconds: 1,
            nanos: 0,
        }),
        num_requests_allowed: 1,
        num_requests_denied: 0,
    }
}

/// Opens a quota stream on `sender` that sends `frames` and stays open,
/// reading its answers.
async fn stream_of(
    sender: &mut hyper::client::conn::http2::SendRequest<StreamBody<Chunks>>,
    addr: SocketAddr,
    frames: Vec<Bytes>,
) -> tokio::task::JoinHandle<()> {
    let body: Chunks = Box::pin(futures_util::StreamExt::chain(
        futures_util::stream::iter(frames.into_iter().map(|f| Ok(Frame::data(f)))),
        futures_util::stream::pending(),
    ));
    open_stream(sender, addr, body).await
}

/// Opens a quota stream on `sender` whose request body is `body`, reading
/// its answers.
async fn open_stream(
    sender: &mut hyper::client::conn::http2::SendRequest<StreamBody<Chunks>>,
    addr: SocketAddr,
    body: Chunks,
) -> tokio::task::JoinHandle<()> {
    sender.ready().await.expect("ready");
    let response = sender.send_request(quota_call(addr, body));
    tokio::spawn(async move {
        if let Ok(response) = response.await {
            let _ = http_body_util::BodyExt::collect(response.into_body()).await;
        }
    })
}

/// How much `tollgate`'s RSS grew from `before` once `usages` bucket usages
/// have been reported to it.
fn grown_once_reported(tollgate: &Tollgate, before: u64, usages: u64) -> u64 {
    tokio::task::block_in_place(|| {
        wait_until(
            &format!("{usages} bucket usages reported"),
            Duration::from_secs(60),
            || tollgate.metric("tollgate_rlqs_bucket_reports_total") == usages,
        )
    });
    rss(tollgate.pid()).saturating_sub(before)
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::await_holding_lock)] // the guard only orders this binary's tests
async fn memory_stays_under_its_ceiling_at_the_bucket_byte_and_pair_bounds() {
    let _alone = alone();
    // Buckets with 60 KB values: 3,000 of them held 593 MB; at the default
    // --rlqs-max-bucket-bytes (64 MiB) about 550 are kept.
    let tollgate = Tollgate::start(RULES, &[]);
    let before = rss(tollgate.pid());
    let mut sender = h2(tollgate.addr, 1 << 30).await;
    let frames: Vec<Bytes> = (0..1_500)
        .map(|i| {
            report_frame(
                (0..2)
                    .map(|j| one_usage(format!("{i}-{j}-{}", "v".repeat(60_000))))
                    .collect(),
            )
        })
        .collect();
    let call = stream_of(&mut sender, tollgate.addr, frames).await;
    let grown = grown_once_reported(&tollgate, before, 3_000);
    let kept = tollgate.metric("tollgate_rlqs_buckets");
    eprintln!(
        "3,000 buckets of 60 KB values: {kept} kept, RSS grew {} MB",
        grown / 1_000_000
    );
    assert!(kept < 600, "{kept} buckets kept");
    assert!(grown < 200_000_000, "RSS grew {grown} bytes");
    call.abort();
    drop(tollgate);

    // Pairs: 25 streams asking for the same 10,000 buckets each, 250,000
    // pairs against a bound of 200,000.
    let tollgate = Tollgate::start(RULES, &["--rlqs-max-pairs", "200000"]);
    let before = rss(tollgate.pid());
    let mut calls = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..25 {
        let mut sender = h2(tollgate.addr, 1 << 30).await;
        let frames: Vec<Bytes> = (0..5)
            .map(|r| report_frame((0..2_000).map(|b| one_usage(format!("{r}-{b}"))).collect()))
            .collect();
        calls.push(stream_of(&mut sender, tollgate.addr, frames).await);
        senders.push(sender);
    }
    let grown = grown_once_reported(&tollgate, before, 250_000);
    let pairs = tollgate.metric("tollgate_rlqs_pairs");
    eprintln!(
        "250,000 buckets asked for: {pairs} pairs held, RSS grew {} MB",
        grown / 1_000_000
    );
    assert_eq!(pairs, 200_000);
    assert!(
        grown < 250_000_000,
        "RSS grew {grown} bytes for 200,000 pairs"
    );
    for call in calls {
        call.abort();
    }
}

/// The review's attack: 200 streams report the same 3,000 buckets (600,000
/// pairs asked for, against the default bound of 500,000) and never read
/// an answer. Resident memory is sampled throughout; its peak growth is
/// what the attack costs.
#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::await_holding_lock)] // the guard only orders this binary's tests
async fn two_hundred_streams_that_never_read_cost_a_bounded_amount_of_memory() {
    let _alone = alone();
    let tollgate = Tollgate::start(RULES, &[]);
    let pid = tollgate.pid();
    let before = rss(pid);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampling = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let frame = report_frame(
        (0..3_000)
            .map(|b| one_usage(format!("bucket-{b}")))
            .collect(),
    );
    let mut calls = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..10 {
        // A window of zero: no answer reaches these clients.
        let mut sender = h2(tollgate.addr, 0).await;
        for _ in 0..20 {
            calls.push(stream_of(&mut sender, tollgate.addr, vec![frame.clone(); 3]).await);
        }
        senders.push(sender);
    }
    // The reports are read (seconds in a debug build) and ticks push new
    // assignments meanwhile.
    tokio::time::sleep(Duration::from_secs(12)).await;
    sampling.abort();
    let grown = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(before);
    let pairs = tollgate.metric("tollgate_rlqs_pairs");
    eprintln!(
        "200 streams x 3,000 buckets, never reading: peak RSS growth {} MB; {pairs} pairs held at the end, {} streams ended",
        grown / 1_000_000,
        tollgate.metric("tollgate_rlqs_streams_ended_total"),
    );
    assert!(
        grown < 400_000_000,
        "RSS grew {grown} bytes at its peak under the attack"
    );
    for call in calls {
        call.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::await_holding_lock)] // the guard only orders this binary's tests
async fn a_bucket_value_that_is_not_utf8_is_answered_and_the_stream_lives_on() {
    use crate::common::raw::{bytes_field, varint};
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse;
    let _alone = alone();
    let tollgate = Tollgate::start(RULES, &[]);
    // A report of one bucket {api_key: "mallory\xff"}, 3 requests allowed.
    let mut pair = Vec::new();
    bytes_field(&mut pair, 1, b"api_key");
    bytes_field(&mut pair, 2, b"mallory\xff");
    let mut id = Vec::new();
    bytes_field(&mut id, 1, &pair);
    let mut usage = Vec::new();
    bytes_field(&mut usage, 1, &id);
    usage.push(3 << 3);
    varint(&mut usage, 3);
    let mut report = Vec::new();
    bytes_field(&mut report, 1, b"rlqs");
    bytes_field(&mut report, 2, &usage);
    let body: Chunks = Box::pin(futures_util::StreamExt::chain(
        futures_util::stream::iter([Ok(Frame::data(grpc_frame(&report)))]),
        futures_util::stream::pending(),
    ));
    let mut sender = h2(tollgate.addr, 1 << 20).await;
    let response = sender
        .send_request(quota_call(tollgate.addr, body))
        .await
        .expect("response");
    let mut body = response.into_body();
    let frame = tokio::time::timeout(
        Duration::from_secs(5),
        http_body_util::BodyExt::frame(&mut body),
    )
    .await
    .expect("an answer within 5 s")
    .expect("the stream goes on")
    .expect("a frame");
    let data = frame
        .into_data()
        .unwrap_or_else(|f| panic!("an answer, not the stream's end: {f:?}"));
    // The answer names the bucket by the bytes Envoy sent (Envoy finds
    // its bucket by them), where the report was read as text.
    let sent = b"mallory\xff";
    assert!(
        data.windows(sent.len()).any(|w| w == sent),
        "the bucket's own bytes in the answer: {data:?}"
    );
    assert!(
        <RateLimitQuotaResponse as prost::Message>::decode(&data[5..]).is_err(),
        "(so a client reading strings cannot decode it: the bytes are not UTF-8)"
    );
}
