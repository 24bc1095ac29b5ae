//! Tracing: an OTLP span for each ShouldRateLimit call (domain, descriptor
//! count, overall code), with a child span for the store call, continuing
//! the trace Envoy propagates (W3C `traceparent`, or B3: single `b3` or the
//! `x-b3-*` headers). Built on the OpenTelemetry SDK and its OTLP exporter
//! (gRPC or HTTP/protobuf), batched on a runtime thread of its own so the
//! request path only records. Off, it costs nothing: the gRPC handler takes
//! this path only when tracing is on.

use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};

/// How spans leave the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExportProtocol {
    /// OTLP over gRPC.
    Grpc,
    /// OTLP over HTTP, protobuf bodies.
    Http,
}

/// What tracing needs.
#[derive(Debug, Clone)]
pub(crate) struct OtelOptions {
    /// The collector (`None`: `OTEL_EXPORTER_OTLP_ENDPOINT` or the
    /// exporter's default, `localhost:4317`/`4318`).
    pub endpoint: Option<String>,
    /// gRPC or HTTP.
    pub protocol: ExportProtocol,
    /// `service.name`.
    pub service_name: String,
    /// `service.namespace`, when set.
    pub service_namespace: Option<String>,
    /// `service.instance.id`, when set.
    pub service_instance_id: Option<String>,
    /// The fraction of new traces sampled (a parent's decision wins).
    pub sampling_rate: f64,
    /// The longest the shutdown flush may take.
    pub shutdown_timeout: Duration,
}

/// The tracer, and the runtime its exporter runs on.
pub(crate) struct Otel {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    runtime: Option<tokio::runtime::Runtime>,
    shutdown_timeout: Duration,
}

impl std::fmt::Debug for Otel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Otel").finish_non_exhaustive()
    }
}

impl Otel {
    /// Starts the exporter; the error says what is wrong with the options.
    pub(crate) fn start(options: &OtelOptions) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tollgate-otel")
            .enable_all()
            .build()
            .map_err(|e| format!("tracing runtime: {e}"))?;
        let _entered = runtime.enter();
        let exporter = match options.protocol {
            ExportProtocol::Grpc => {
                let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                if let Some(endpoint) = &options.endpoint {
                    builder = builder.with_endpoint(endpoint.clone());
                }
                builder.build()
            }
            ExportProtocol::Http => {
                let mut builder = opentelemetry_otlp::SpanExporter::builder().with_http();
                if let Some(endpoint) = &options.endpoint {
                    // As OTEL_EXPORTER_OTLP_ENDPOINT: the base, to which the
                    // traces path is added.
                    let base = endpoint.trim_end_matches('/');
                    let url = if base.ends_with("/v1/traces") {
                        base.to_owned()
                    } else {
                        format!("{base}/v1/traces")
                    };
                    builder = builder.with_endpoint(url);
                }
                builder.build()
            }
        }
        .map_err(|e| format!("OTLP exporter: {e}"))?;
        let processor =
            BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let mut resource = Resource::builder().with_service_name(options.service_name.clone());
        if let Some(ns) = &options.service_namespace {
            resource = resource.with_attribute(KeyValue::new("service.namespace", ns.clone()));
        }
        if let Some(id) = &options.service_instance_id {
            resource = resource.with_attribute(KeyValue::new("service.instance.id", id.clone()));
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                options.sampling_rate,
            ))))
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("tollgate");
        drop(_entered);
        Ok(Self {
            tracer,
            provider,
            runtime: Some(runtime),
            shutdown_timeout: options.shutdown_timeout,
        })
    }

    /// A span for one ShouldRateLimit call, child of what `headers` carry.
    pub(crate) fn request_span(
        &self,
        headers: &http::HeaderMap,
        domain: &str,
        descriptors: usize,
    ) -> RequestSpan {
        let parent = parent_context(headers);
        let span = self
            .tracer
            .span_builder("ShouldRateLimit")
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("rpc.system", "grpc"),
                KeyValue::new("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
                KeyValue::new("rpc.method", "ShouldRateLimit"),
                KeyValue::new("ratelimit.domain", domain.to_owned()),
                KeyValue::new("ratelimit.descriptors", descriptors as i64),
            ])
            .start_with_context(&self.tracer, &parent);
        RequestSpan {
            cx: parent.with_span(span),
        }
    }

    /// The store call of a request, as a child span.
    pub(crate) fn store_span(
        &self,
        request: &RequestSpan,
        start: SystemTime,
        end: SystemTime,
        error: Option<&str>,
    ) {
        let mut span = self
            .tracer
            .span_builder("store")
            .with_kind(SpanKind::Client)
            .with_start_time(start)
            .start_with_context(&self.tracer, &request.cx);
        if let Some(error) = error {
            span.set_status(Status::error(error.to_owned()));
        }
        span.end_with_timestamp(end);
    }

    /// Sends what is buffered (at shutdown), for `shutdown_timeout` at most:
    /// a collector that does not answer (each export would wait out its own
    /// timeout, and the flush and the shutdown each export) costs the spans
    /// still buffered, never the process's exit.
    pub(crate) fn shutdown(mut self) {
        let provider = self.provider.clone();
        let (done_tx, done) = std::sync::mpsc::channel();
        let flushing = std::thread::Builder::new()
            .name("tollgate-otel-flush".into())
            .spawn(move || {
                let flushed = provider.force_flush();
                let _ = provider.shutdown();
                let _ = done_tx.send(flushed);
            });
        let outcome = match flushing {
            Ok(_) => done.recv_timeout(self.shutdown_timeout).ok(),
            Err(_) => None,
        };
        match outcome {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the spans still buffered at shutdown were not sent")
            }
            None => tracing::warn!(
                timeout = ?self.shutdown_timeout,
                "the collector did not take the spans still buffered within --tracing-shutdown-timeout; they are dropped"
            ),
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_millis(100));
        }
    }
}

/// An open request span.
pub(crate) struct RequestSpan {
    cx: Context,
}

impl RequestSpan {
    /// Ends the span with the call's outcome: the overall code
    /// (`OK`/`OVER_LIMIT`), or the gRPC error.
    pub(crate) fn finish(self, outcome: Result<&'static str, &str>) {
        let span = self.cx.span();
        match outcome {
            Ok(code) => span.set_attribute(KeyValue::new("ratelimit.overall_code", code)),
            Err(error) => span.set_status(Status::error(error.to_owned())),
        }
        span.end();
    }
}

struct Headers<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The trace Envoy propagates: W3C `traceparent`, else B3; else none.
fn parent_context(headers: &http::HeaderMap) -> Context {
    use opentelemetry::propagation::TextMapPropagator;
    if headers.contains_key("traceparent") {
        return TraceContextPropagator::new().extract(&Headers(headers));
    }
    match b3(headers) {
        Some(span) => Context::new().with_remote_span_context(span),
        None => Context::new(),
    }
}

/// A B3 span context: the single `b3: trace-span[-sampled[-parent]]`
/// header, or `x-b3-traceid`, `x-b3-spanid` and `x-b3-sampled`/`x-b3-flags`.
/// A 64-bit trace id is widened to 128 bits.
fn b3(headers: &http::HeaderMap) -> Option<SpanContext> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (trace, span, sampled) = match get("b3") {
        Some(single) => {
            let mut parts = single.split('-');
            (parts.next()?, parts.next()?, parts.next())
        }
        None => (
            get("x-b3-traceid")?,
            get("x-b3-spanid")?,
            get("x-b3-flags")
                .filter(|f| *f == "1")
                .map(|_| "d")
                .or_else(|| get("x-b3-sampled")),
        ),
    };
    if !(trace.len() == 16 || trace.len() == 32) || span.len() != 16 {
        return None;
    }
    let trace = TraceId::from_hex(&format!("{trace:0>32}")).ok()?;
    let span = SpanId::from_hex(span).ok()?;
    let flags = match sampled {
        Some("1" | "d" | "true") => TraceFlags::SAMPLED,
        _ => TraceFlags::default(),
    };
    let context = SpanContext::new(trace, span, flags, true, TraceState::default());
    context.is_valid().then_some(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, v.parse().expect("value"));
        }
        map
    }

    #[test]
    fn the_parent_comes_from_traceparent_or_b3() {
        let w3c = parent_context(&headers(&[(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )]));
        let span = w3c.span().span_context().clone();
        assert_eq!(
            span.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(span.span_id().to_string(), "00f067aa0ba902b7");
        assert!(span.is_sampled() && span.is_remote());

        let single = parent_context(&headers(&[(
            "b3",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1",
        )]));
        assert_eq!(
            single.span().span_context().trace_id().to_string(),
            "80f198ee56343ba864fe8b2a57d3eff7"
        );
        let multi = parent_context(&headers(&[
            ("x-b3-traceid", "a3ce929d0e0e4736"),
            ("x-b3-spanid", "00f067aa0ba902b7"),
            ("x-b3-sampled", "0"),
        ]));
        let span = multi.span().span_context().clone();
        assert_eq!(
            span.trace_id().to_string(),
            "0000000000000000a3ce929d0e0e4736"
        );
        assert!(!span.is_sampled());
        for bad in [
            headers(&[("b3", "nonsense")]),
            headers(&[("b3", "0000000000000000-0000000000000000-1")]),
            headers(&[("x-b3-traceid", "zz"), ("x-b3-spanid", "00f067aa0ba902b7")]),
        ] {
            assert!(
                !parent_context(&bad).span().span_context().is_valid(),
                "{bad:?}"
            );
        }
    }
}
