//! The command line. Every flag is also an environment variable; values are
//! validated here, once.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::algorithm::Algorithm;
use crate::rules::{FailureMode, LoadOptions};

/// Tollgate: a rate limit service for Envoy.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve Envoy's RateLimitService over gRPC.
    Serve(ServeArgs),
    /// Validate rule files, print the compiled rules, exit non-zero on errors.
    Check(CheckArgs),
}

/// `tollgate serve`.
#[derive(Debug, Args, Clone)]
pub struct ServeArgs {
    /// Rule file or directory; repeat for several. Default: ./examples/rules.
    #[arg(long = "rules", env = "TOLLGATE_RULES", value_delimiter = ',')]
    pub rules: Vec<PathBuf>,

    /// gRPC listen address.
    #[arg(long, env = "TOLLGATE_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    pub grpc_addr: SocketAddr,

    /// Algorithm for limits that do not name one.
    #[arg(long, env = "TOLLGATE_DEFAULT_ALGORITHM", value_enum, default_value_t = AlgorithmArg::SlidingWindow)]
    pub default_algorithm: AlgorithmArg,

    /// Add RateLimit, RateLimit-Policy and Retry-After response headers.
    #[arg(long, env = "TOLLGATE_RESPONSE_HEADERS", value_enum, default_value_t = OnOff::On)]
    pub response_headers: OnOff,

    /// Merge rule files that declare the same domain (the reference's
    /// MERGE_DOMAIN_CONFIG=true is also honoured).
    #[arg(long, env = "TOLLGATE_MERGE_DOMAINS")]
    pub merge_domains: bool,

    /// Answer for limits without `failure_mode` when the store fails.
    #[arg(long, env = "TOLLGATE_FAILURE_MODE", value_enum, default_value_t = FailureModeArg::Allow)]
    pub failure_mode: FailureModeArg,

    /// The most keys the memory store holds; past it, new keys get the
    /// failure mode until old ones expire.
    #[arg(long, env = "TOLLGATE_MAX_KEYS", default_value_t = 20_000_000)]
    pub max_keys: usize,

    /// Worker threads, each with its own runtime and listener. Default: one per core.
    #[arg(long, env = "TOLLGATE_WORKERS")]
    pub workers: Option<usize>,

    /// Log filter (tracing syntax, e.g. `info` or `tollgate=debug`).
    #[arg(long, env = "TOLLGATE_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
}

/// `tollgate check`.
#[derive(Debug, Args, Clone)]
pub struct CheckArgs {
    /// Rule files or directories.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Merge files that declare the same domain.
    #[arg(long, env = "TOLLGATE_MERGE_DOMAINS")]
    pub merge_domains: bool,
    /// Algorithm for limits that do not name one.
    #[arg(long, env = "TOLLGATE_DEFAULT_ALGORITHM", value_enum, default_value_t = AlgorithmArg::SlidingWindow)]
    pub default_algorithm: AlgorithmArg,
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// Algorithm names on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AlgorithmArg {
    /// Fixed window.
    FixedWindow,
    /// Sliding window counter.
    SlidingWindow,
    /// Token bucket (GCRA).
    TokenBucket,
}

impl From<AlgorithmArg> for Algorithm {
    fn from(a: AlgorithmArg) -> Self {
        match a {
            AlgorithmArg::FixedWindow => Algorithm::FixedWindow,
            AlgorithmArg::SlidingWindow => Algorithm::SlidingWindow,
            AlgorithmArg::TokenBucket => Algorithm::TokenBucket,
        }
    }
}

/// Failure modes on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailureModeArg {
    /// Fail open.
    Allow,
    /// Fail closed.
    Deny,
}

impl From<FailureModeArg> for FailureMode {
    fn from(m: FailureModeArg) -> Self {
        match m {
            FailureModeArg::Allow => FailureMode::Allow,
            FailureModeArg::Deny => FailureMode::Deny,
        }
    }
}

/// The reference's switch for domain merging.
fn reference_merge_domains() -> bool {
    std::env::var("MERGE_DOMAIN_CONFIG").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
}

impl ServeArgs {
    /// The rule paths, defaulting to the bundled examples.
    pub fn rule_paths(&self) -> Vec<PathBuf> {
        if self.rules.is_empty() {
            vec![PathBuf::from("examples/rules")]
        } else {
            self.rules.clone()
        }
    }

    /// How rules are loaded.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            merge_domains: self.merge_domains || reference_merge_domains(),
            default_algorithm: self.default_algorithm.into(),
        }
    }
}

impl CheckArgs {
    /// How rules are loaded.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            merge_domains: self.merge_domains || reference_merge_domains(),
            default_algorithm: self.default_algorithm.into(),
        }
    }
}
