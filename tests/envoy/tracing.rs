//! Tracing against an OTLP receiver in the test (gRPC, and HTTP with
//! protobuf bodies): one span per ShouldRateLimit call continuing the trace
//! of the `traceparent` (or B3) headers Envoy sends, with the domain, the
//! descriptor count and the overall code, and a child span for the store
//! call; configured by Tollgate's flags or the reference's variables.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::redis::RedisServer;
use crate::common::{Tollgate, eventually, request};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

const RULES: &str =
    "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";

/// A span as received, flattened.
#[derive(Debug, Clone)]
struct Received {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: Vec<(String, String)>,
    service: String,
}

type Spans = Arc<Mutex<Vec<Received>>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn value(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        other => format!("{other:?}"),
    }
}

fn record(spans: &Spans, export: ExportTraceServiceRequest) {
    for resource in export.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "service.name")
            .map(|a| value(&a.value))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                spans.lock().expect("spans").push(Received {
                    name: span.name.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), value(&a.value)))
                        .collect(),
                    service: service.clone(),
                });
            }
        }
    }
}

#[derive(Clone)]
struct Collector(Spans);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        record(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP receiver: gRPC when `grpc`, else HTTP (`POST /v1/traces`).
async fn receiver(grpc: bool) -> (SocketAddr, Spans) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let spans = Spans::default();
    let collected = spans.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let spans = collected.clone();
            tokio::spawn(async move {
                if grpc {
                    let service =
                        TowerToHyperService::new(TraceServiceServer::new(Collector(spans)));
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                } else {
                    let service = hyper::service::service_fn(
                        move |req: http::Request<hyper::body::Incoming>| {
                            let spans = spans.clone();
                            async move {
                                let path = req.uri().path().to_owned();
                                let body = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                if path == "/v1/traces"
                                    && let Ok(export) = ExportTraceServiceRequest::decode(body)
                                {
                                    record(&spans, export);
                                }
                                let reply = ExportTraceServiceResponse::default().encode_to_vec();
                                Ok::<_, Infallible>(
                                    http::Response::builder()
                                        .header("content-type", "application/x-protobuf")
                                        .body(http_body_util::Full::new(bytes::Bytes::from(reply)))
                                        .expect("response"),
                                )
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                }
            });
        }
    });
    (addr, spans)
}

async fn call_with(server: &Tollgate, header: (&'static str, &str), user: &str) {
    let mut client = server.client().await;
    let mut req = tonic::Request::new(request("t", &[&[("user", user)]]));
    req.metadata_mut()
        .insert(header.0, header.1.parse().expect("header"));
    client.should_rate_limit(req).await.expect("answered");
}

async fn wait_for(spans: &Spans, count: usize) -> Vec<Received> {
    let arrived = eventually(Duration::from_secs(15), async || {
        spans.lock().expect("spans").len() >= count
    })
    .await;
    let got = spans.lock().expect("spans").clone();
    assert!(arrived, "{count} spans within 15 s; got {got:#?}");
    got
}

fn attribute<'a>(span: &'a Received, key: &str) -> Option<&'a str> {
    span.attributes
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_continue_envoys_w3c_trace_over_grpc_with_a_store_child() {
    let (addr, spans) = receiver(true).await;
    let redis = RedisServer::start();
    let endpoint = format!("http://{addr}");
    let url = redis.url();
    let server = Tollgate::start_with_env(
        RULES,
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-timeout",
            "1s",
            "--tracing",
            "on",
            "--tracing-protocol",
            "grpc",
            "--tracing-endpoint",
            &endpoint,
            "--tracing-service-name",
            "rl-test",
        ],
        // Batches leave every 200 ms instead of 5 s.
        &[("OTEL_BSP_SCHEDULE_DELAY", "200")],
    );
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    call_with(
        &server,
        ("traceparent", &format!("00-{trace}-{parent}-01")),
        "ann",
    )
    .await;
    call_with(
        &server,
        ("traceparent", &format!("00-{trace}-{parent}-01")),
        "ann",
    )
    .await;
    let got = wait_for(&spans, 4).await;
    let requests: Vec<&Received> = got.iter().filter(|s| s.name == "ShouldRateLimit").collect();
    assert_eq!(requests.len(), 2, "{got:#?}");
    for span in &requests {
        assert_eq!(span.trace_id, trace);
        assert_eq!(span.parent_span_id, parent, "continues Envoy's span");
        assert_eq!(span.service, "rl-test");
        assert_eq!(attribute(span, "ratelimit.domain"), Some("t"));
        assert_eq!(attribute(span, "ratelimit.descriptors"), Some("1"));
        let store = got
            .iter()
            .find(|s| s.name == "store" && s.parent_span_id == span.span_id)
            .unwrap_or_else(|| panic!("a store span under {span:?}: {got:#?}"));
        assert_eq!(store.trace_id, trace);
    }
    let mut codes: Vec<&str> = requests
        .iter()
        .filter_map(|s| attribute(s, "ratelimit.overall_code"))
        .collect();
    codes.sort_unstable();
    assert_eq!(codes, ["OK", "OVER_LIMIT"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_references_variables_export_over_http_and_b3_is_continued() {
    let (addr, spans) = receiver(false).await;
    let endpoint = format!("http://{addr}");
    let server = Tollgate::start_with_env(
        RULES,
        &[],
        &[
            ("TRACING_ENABLED", "true"),
            ("TRACING_EXPORTER_PROTOCOL", "http"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SAMPLING_RATE", "1.0"),
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ],
    );
    let trace = "80f198ee56343ba864fe8b2a57d3eff7";
    call_with(
        &server,
        ("b3", &format!("{trace}-e457b5a2e4d86bd1-1")),
        "bob",
    )
    .await;
    let got = wait_for(&spans, 2).await;
    let span = got
        .iter()
        .find(|s| s.name == "ShouldRateLimit")
        .expect("request span");
    assert_eq!(span.trace_id, trace);
    assert_eq!(span.parent_span_id, "e457b5a2e4d86bd1");
    assert_eq!(span.service, "RateLimit", "the reference's default name");
    assert_eq!(attribute(span, "ratelimit.overall_code"), Some("OK"));
}

/// A collector that accepts connections and never answers holds the spans
/// still buffered at shutdown for --tracing-shutdown-timeout at most: the
/// process exits well within Kubernetes' 30 s grace period, and says what
/// it dropped.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_collector_does_not_hold_the_shutdown() {
    let hung = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = hung.local_addr().expect("addr");
    let held = std::thread::spawn(move || {
        // Accepts and holds every connection; reads and answers nothing.
        let mut held = Vec::new();
        for stream in hung.incoming().take(16).flatten() {
            held.push(stream);
        }
    });
    let endpoint = format!("http://{addr}");
    let mut server = Tollgate::start(
        RULES,
        &[
            "--tracing",
            "on",
            "--tracing-protocol",
            "grpc",
            "--tracing-endpoint",
            &endpoint,
            "--tracing-shutdown-timeout",
            "2s",
        ],
    );
    for user in ["ann", "bob", "cy"] {
        call_with(
            &server,
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            user,
        )
        .await;
    }
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let started = std::time::Instant::now();
    let exit = tokio::task::block_in_place(|| server.child.wait()).expect("wait");
    let took = started.elapsed();
    assert!(exit.success(), "{exit:?}");
    // --shutdown-delay (1 s) + the calls in flight (none) + the flush bound.
    assert!(
        took < std::time::Duration::from_secs(6),
        "exited {took:?} after SIGTERM"
    );
    assert!(
        server.log_count("within --tracing-shutdown-timeout") + server.log_count("were not sent")
            >= 1,
        "the dropped spans are logged"
    );
    drop(held);
}

/// A collector that refuses connections: the failed exports are logged,
/// summarised (at most one line per 10 s), not silent.
#[tokio::test(flavor = "multi_thread")]
async fn failed_exports_are_logged_once_per_interval() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let endpoint = format!("http://{closed}");
    let server = Tollgate::start_with_env(
        RULES,
        &[
            "--tracing",
            "on",
            "--tracing-protocol",
            "http",
            "--tracing-endpoint",
            &endpoint,
        ],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    for user in ["ann", "bob"] {
        call_with(
            &server,
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            user,
        )
        .await;
    }
    let t = &server;
    tokio::task::block_in_place(|| {
        crate::common::wait_until(
            "the failed export is logged",
            Duration::from_secs(15),
            || t.log_count("spans could not be exported") >= 1,
        )
    });
    assert_eq!(
        server.log_count("spans could not be exported"),
        1,
        "summarised, not a line per failed batch"
    );
}
