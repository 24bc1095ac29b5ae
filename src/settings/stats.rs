//! `tollgate serve`'s flags for the reference's stats (see [`crate::stats`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{OnOff, parse_duration};
use crate::stats::statsd::{Protocol, StatsdOptions};

/// statsd transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StatsdProtocol {
    /// One TCP connection (the reference's default).
    Tcp,
    /// UDP datagrams.
    Udp,
}

/// The reference's stats: statsd, and a statsd-mapped Prometheus endpoint.
#[derive(Debug, Args, Clone)]
pub(crate) struct StatsArgs {
    /// Send the reference's stats to statsd at this `host:port`.
    #[arg(long, env = "TOLLGATE_STATSD")]
    pub statsd: Option<String>,

    /// statsd over `tcp` or `udp`.
    #[arg(long, env = "TOLLGATE_STATSD_PROTOCOL", value_enum, default_value_t = StatsdProtocol::Tcp)]
    pub statsd_protocol: StatsdProtocol,

    /// Time between two statsd flushes.
    #[arg(long, env = "TOLLGATE_STATSD_FLUSH_INTERVAL", default_value = "10s", value_parser = parse_interval)]
    pub statsd_flush_interval: Duration,

    /// The longest a statsd connection or flush may take over TCP; past it
    /// the connection is dropped and made again at the next flush (a statsd
    /// that stops reading must not stop the stats silently).
    #[arg(long, env = "TOLLGATE_STATSD_TIMEOUT", default_value = "2s", value_parser = parse_interval)]
    pub statsd_timeout: Duration,

    /// DogStatsD: tags (`--statsd-tags`) on every line.
    #[arg(long, env = "TOLLGATE_DOGSTATSD", value_enum, default_value_t = OnOff::Off)]
    pub dogstatsd: OnOff,

    /// DogStatsD tags, `key:value,...`.
    #[arg(long, env = "TOLLGATE_STATSD_TAGS", value_delimiter = ',', value_parser = parse_tag)]
    pub statsd_tags: Vec<(String, String)>,

    /// Serve the reference's stats as Prometheus metrics on this address,
    /// through --statsd-mapping (the reference's USE_PROMETHEUS).
    #[arg(long, env = "TOLLGATE_REFERENCE_METRICS_ADDR")]
    pub reference_metrics_addr: Option<SocketAddr>,

    /// The path of that endpoint.
    #[arg(
        long,
        env = "TOLLGATE_REFERENCE_METRICS_PATH",
        default_value = "/metrics"
    )]
    pub reference_metrics_path: String,

    /// A statsd-exporter mapping file for that endpoint.
    #[arg(
        long,
        env = "TOLLGATE_STATSD_MAPPING",
        requires = "reference_metrics_addr"
    )]
    pub statsd_mapping: Option<PathBuf>,
}

/// A duration of at least a millisecond.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d < Duration::from_millis(1) {
        return Err(format!("'{text}': at least 1ms"));
    }
    Ok(d)
}

/// `key:value`.
fn parse_tag(text: &str) -> Result<(String, String), String> {
    let (k, v) = text
        .split_once(':')
        .ok_or_else(|| format!("'{text}': expected key:value"))?;
    if k.trim().is_empty() {
        return Err(format!("'{text}': empty key"));
    }
    Ok((k.trim().to_owned(), v.trim().to_owned()))
}

impl StatsArgs {
    /// statsd output, when asked for.
    pub(crate) fn statsd_options(&self) -> Option<StatsdOptions> {
        let addr = self.statsd.clone()?;
        Some(StatsdOptions {
            addr,
            protocol: match self.statsd_protocol {
                StatsdProtocol::Tcp => Protocol::Tcp,
                StatsdProtocol::Udp => Protocol::Udp,
            },
            flush_interval: self.statsd_flush_interval,
            timeout: self.statsd_timeout,
            tags: (self.dogstatsd == OnOff::On).then(|| self.statsd_tags.clone()),
        })
    }
}
