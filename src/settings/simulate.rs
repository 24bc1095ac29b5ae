//! `tollgate simulate`'s flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::rule_load::RuleLoadArgs;
use super::values::{AlgorithmArg, at_least_one, parse_duration};

/// `tollgate simulate`.
#[derive(Debug, Args, Clone)]
pub(crate) struct SimulateArgs {
    /// Rule file or directory; repeat to compare rule sets side by side.
    #[arg(long = "rules", required = true)]
    pub rules: Vec<PathBuf>,
    /// Traffic: JSON lines (a RateLimitRequest as `POST /json` takes it,
    /// plus `timestamp`), or Envoy access logs with --envoy-config; repeatable.
    #[arg(long = "traffic")]
    pub traffic: Vec<PathBuf>,
    /// The Envoy configuration whose rate limit filter, routes and access
    /// log format turn access log lines into descriptors.
    #[arg(long)]
    pub envoy_config: Option<PathBuf>,
    /// Generate traffic: `rate=100,seconds=600,clients=100,zipf=1,burstiness=0,domain=api,key=client,seed=1`.
    #[arg(long)]
    pub generate: Option<crate::simulate::Generate>,
    /// Also write the traffic (read and generated) as JSON lines to this file.
    #[arg(long)]
    pub save_traffic: Option<PathBuf>,
    /// Replay under this algorithm instead of each limit's own; repeat to
    /// compare (calendar quotas stay fixed windows).
    #[arg(long = "algorithm", value_enum)]
    pub algorithms: Vec<AlgorithmArg>,
    /// Write summary.json, series.csv, series.json and report.html here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Width of the plotted series' bins, e.g. `1s` (default: about 300 points).
    #[arg(long, value_parser = parse_duration)]
    pub bin: Option<Duration>,
    /// How rule files are read.
    #[command(flatten)]
    pub rule_load: RuleLoadArgs,
    /// The most requests held for the run (traffic files, with what is
    /// generated beside them): about 250 bytes each (so about 1 GB at the
    /// default). Generated traffic alone is made again for each replay and
    /// never held, so it is not bounded by this.
    #[arg(long, default_value_t = 4_000_000, value_parser = at_least_one)]
    pub max_events: usize,
    /// The most requests `--generate` may make on its own (streamed, not
    /// held): a bound on the run's time, each request replayed once per
    /// scenario (about a million a second in a release build).
    #[arg(long, default_value_t = 1_000_000_000, value_parser = at_least_one)]
    pub max_generated: usize,
}

impl SimulateArgs {
    /// The simulation these arguments ask for.
    pub(crate) fn simulation(&self) -> crate::simulate::Simulation {
        crate::simulate::Simulation {
            rules: self.rules.clone(),
            traffic: self.traffic.clone(),
            envoy_config: self.envoy_config.clone(),
            generate: self.generate.clone(),
            algorithms: self.algorithms.iter().map(|a| (*a).into()).collect(),
            load: self.rule_load.load_options(),
            bin: self.bin.map(|b| b.as_nanos() as u64),
            max_events: self.max_events,
            max_generated: self.max_generated,
        }
    }
}
