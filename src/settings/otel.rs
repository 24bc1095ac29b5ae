//! `tollgate serve`'s tracing flags (see [`crate::otel`]).

use clap::{Args, ValueEnum};

use super::{OnOff, parse_fraction};
use crate::otel::{ExportProtocol, OtelOptions};

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TracingProtocol {
    /// OTLP over HTTP with protobuf bodies (the reference's default).
    Http,
    /// OTLP over gRPC.
    Grpc,
}

/// Tracing of ShouldRateLimit calls.
#[derive(Debug, Args, Clone)]
pub(crate) struct OtelArgs {
    /// Send an OTLP span for each ShouldRateLimit call.
    #[arg(long, env = "TOLLGATE_TRACING", value_enum, default_value_t = OnOff::Off)]
    pub tracing: OnOff,

    /// The OTLP collector (default: OTEL_EXPORTER_OTLP_ENDPOINT, else
    /// localhost:4318 for HTTP, 4317 for gRPC).
    #[arg(long, env = "TOLLGATE_TRACING_ENDPOINT")]
    pub tracing_endpoint: Option<String>,

    /// `http` (protobuf) or `grpc`.
    #[arg(long, env = "TOLLGATE_TRACING_PROTOCOL", value_enum, default_value_t = TracingProtocol::Http)]
    pub tracing_protocol: TracingProtocol,

    /// The spans' `service.name`.
    #[arg(
        long,
        env = "TOLLGATE_TRACING_SERVICE_NAME",
        default_value = "tollgate"
    )]
    pub tracing_service_name: String,

    /// The spans' `service.namespace`.
    #[arg(long, env = "TOLLGATE_TRACING_SERVICE_NAMESPACE")]
    pub tracing_service_namespace: Option<String>,

    /// The spans' `service.instance.id`.
    #[arg(long, env = "TOLLGATE_TRACING_SERVICE_INSTANCE_ID")]
    pub tracing_service_instance_id: Option<String>,

    /// The fraction of new traces sampled, 0 to 1 (a parent's decision,
    /// from Envoy's headers, wins).
    #[arg(long, env = "TOLLGATE_TRACING_SAMPLING_RATE", default_value_t = 1.0, value_parser = parse_fraction)]
    pub tracing_sampling_rate: f64,

    /// At shutdown, the longest the spans still buffered may take to reach
    /// the collector; past it they are dropped (a hung collector must not
    /// hold the process past Kubernetes' grace period).
    #[arg(long, env = "TOLLGATE_TRACING_SHUTDOWN_TIMEOUT", default_value = "3s", value_parser = super::parse_duration)]
    pub tracing_shutdown_timeout: std::time::Duration,
}

impl OtelArgs {
    /// The tracer's options, when tracing is on.
    pub(crate) fn options(&self) -> Option<OtelOptions> {
        (self.tracing == OnOff::On).then(|| OtelOptions {
            endpoint: self.tracing_endpoint.clone(),
            protocol: match self.tracing_protocol {
                TracingProtocol::Http => ExportProtocol::Http,
                TracingProtocol::Grpc => ExportProtocol::Grpc,
            },
            service_name: self.tracing_service_name.clone(),
            service_namespace: self.tracing_service_namespace.clone(),
            service_instance_id: self.tracing_service_instance_id.clone(),
            sampling_rate: self.tracing_sampling_rate,
            shutdown_timeout: self.tracing_shutdown_timeout,
        })
    }
}
