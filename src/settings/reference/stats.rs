//! The reference's observability variables: `USE_STATSD` and its
//! `STATSD_*`, `USE_DOG_STATSD`, `EXTRA_TAGS`, `STATS_FLUSH_INTERVAL`,
//! `USE_PROMETHEUS` with `PROMETHEUS_*`, `DISABLE_STATS`, and `TRACING_*`.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::Vars;
use crate::settings::{OnOff, ServeArgs, TracingProtocol};

/// The reference's stats variables onto `--statsd*` and
/// `--reference-metrics-*`.
pub(super) fn stats(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    let set = |name: &str| vars.set(name);
    let boolean = |name: &str| vars.boolean(name).map(|b| b.unwrap_or(false));
    // The reference sends nothing anywhere with DISABLE_STATS.
    if boolean("DISABLE_STATS")? {
        return Ok(());
    }
    let s = &mut args.stats;
    if boolean("USE_STATSD")? {
        let host = set("STATSD_HOST").unwrap_or_else(|| "localhost".into());
        let port = set("STATSD_PORT").unwrap_or_else(|| "8125".into());
        port.parse::<u16>()
            .map_err(|_| format!("STATSD_PORT={port}: not a port"))?;
        vars.adopt(
            &mut s.statsd,
            Some(format!("{host}:{port}")),
            "statsd",
            "USE_STATSD/STATSD_HOST/STATSD_PORT",
        )?;
        if boolean("USE_DOG_STATSD")? {
            vars.adopt(&mut s.dogstatsd, OnOff::On, "dogstatsd", "USE_DOG_STATSD")?;
        }
        // envconfig's map form: "key1:val1,key2:val2".
        if let Some(tags) = set("EXTRA_TAGS") {
            let mut pairs = Vec::new();
            for entry in tags.split(',') {
                let (k, v) = entry
                    .split_once(':')
                    .ok_or_else(|| format!("EXTRA_TAGS: '{entry}' is not key:value"))?;
                pairs.push((k.trim().to_owned(), v.trim().to_owned()));
            }
            vars.adopt(&mut s.statsd_tags, pairs, "statsd_tags", "EXTRA_TAGS")?;
        }
        if let Some(interval) = set("STATS_FLUSH_INTERVAL") {
            let d = crate::settings::parse_duration(&interval)
                .map_err(|e| format!("STATS_FLUSH_INTERVAL={interval}: {e}"))?;
            if d.is_zero() {
                return Err(format!(
                    "STATS_FLUSH_INTERVAL={interval}: must be above zero"
                ));
            }
            vars.adopt(
                &mut s.statsd_flush_interval,
                d,
                "statsd_flush_interval",
                "STATS_FLUSH_INTERVAL",
            )?;
        }
    }
    if boolean("USE_PROMETHEUS")? {
        // The reference's form is Go's: ":19001" is every interface.
        let addr = set("PROMETHEUS_ADDR").unwrap_or_else(|| ":9090".into());
        let full = if addr.starts_with(':') {
            format!("0.0.0.0{addr}")
        } else {
            addr.clone()
        };
        let parsed: SocketAddr = full
            .parse()
            .map_err(|_| format!("PROMETHEUS_ADDR={addr}: expected [host]:port"))?;
        vars.adopt(
            &mut s.reference_metrics_addr,
            Some(parsed),
            "reference_metrics_addr",
            "PROMETHEUS_ADDR",
        )?;
        if let Some(path) = set("PROMETHEUS_PATH") {
            vars.adopt(
                &mut s.reference_metrics_path,
                path,
                "reference_metrics_path",
                "PROMETHEUS_PATH",
            )?;
        }
        if let Some(file) = set("PROMETHEUS_MAPPER_YAML") {
            vars.adopt(
                &mut s.statsd_mapping,
                Some(PathBuf::from(file)),
                "statsd_mapping",
                "PROMETHEUS_MAPPER_YAML",
            )?;
        }
    }
    Ok(())
}

/// The reference's `TRACING_*` variables onto `--tracing*`; the exporter
/// reads `OTEL_EXPORTER_OTLP_ENDPOINT` itself.
pub(super) fn tracing(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    let set = |name: &str| vars.set(name);
    if vars.boolean("TRACING_ENABLED")? != Some(true) {
        return Ok(());
    }
    let t = &mut args.otel;
    vars.adopt(&mut t.tracing, OnOff::On, "tracing", "TRACING_ENABLED")?;
    if let Some(protocol) = set("TRACING_EXPORTER_PROTOCOL") {
        let protocol = match protocol.to_ascii_lowercase().as_str() {
            "http" => TracingProtocol::Http,
            "grpc" => TracingProtocol::Grpc,
            other => {
                return Err(format!(
                    "TRACING_EXPORTER_PROTOCOL={other}: expected http or grpc"
                ));
            }
        };
        vars.adopt(
            &mut t.tracing_protocol,
            protocol,
            "tracing_protocol",
            "TRACING_EXPORTER_PROTOCOL",
        )?;
    }
    // The reference's default service name.
    let name = set("TRACING_SERVICE_NAME").unwrap_or_else(|| "RateLimit".into());
    vars.adopt(
        &mut t.tracing_service_name,
        name,
        "tracing_service_name",
        "TRACING_SERVICE_NAME",
    )?;
    if let Some(ns) = set("TRACING_SERVICE_NAMESPACE") {
        vars.adopt(
            &mut t.tracing_service_namespace,
            Some(ns),
            "tracing_service_namespace",
            "TRACING_SERVICE_NAMESPACE",
        )?;
    }
    if let Some(id) = set("TRACING_SERVICE_INSTANCE_ID") {
        vars.adopt(
            &mut t.tracing_service_instance_id,
            Some(id),
            "tracing_service_instance_id",
            "TRACING_SERVICE_INSTANCE_ID",
        )?;
    }
    if let Some(rate) = set("TRACING_SAMPLING_RATE") {
        let value = rate
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| {
                format!("TRACING_SAMPLING_RATE={rate}: expected a number from 0 to 1")
            })?;
        vars.adopt(
            &mut t.tracing_sampling_rate,
            value,
            "tracing_sampling_rate",
            "TRACING_SAMPLING_RATE",
        )?;
    }
    Ok(())
}
