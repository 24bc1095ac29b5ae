//! The command line. Every flag is also an environment variable; values are
//! validated here, once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod data;
mod limited;
mod load;
mod otel;
mod redis_url;
mod reference;
mod rlqs;
mod rule_load;
mod serve;
mod simulate;
mod stats;
mod top;
mod unknown;
mod values;
mod xds;

pub(crate) use data::DataArgs;
pub(crate) use limited::{AdminReads, LimitedArgs};
pub use load::Env;
pub(crate) use load::{LoadError, load};
pub(crate) use otel::{OtelArgs, TracingProtocol};
pub(crate) use redis_url::RedisUrl;
pub(crate) use rlqs::RlqsArgs;
pub(crate) use rule_load::RuleLoadArgs;
pub(crate) use serve::StoreOptions;
pub(crate) use simulate::SimulateArgs;
pub(crate) use stats::StatsArgs;
pub(crate) use top::TopArgs;
pub(crate) use unknown::unknown_env;
pub(crate) use values::LogFormat;
pub(crate) use values::{
    AlgorithmArg, FailureModeArg, Keepalive, OnOff, OnStoreError, OverLimitBodyArg, StoreKind,
    parse_duration,
};
use values::{at_least_one, parse_fraction, parse_keepalive};
pub(crate) use xds::XdsArgs;

use crate::rules::LoadOptions;

/// Tollgate: a rate limit service for Envoy.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version = crate::build_info::LONG_VERSION, about)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serve Envoy's RateLimitService over gRPC.
    Serve(Box<ServeArgs>),
    /// Validate rule files, print the compiled rules, exit non-zero on errors.
    Check(CheckArgs),
    /// Replay timestamped requests (JSON lines, Envoy access logs, or
    /// generated traffic) through rule sets on a simulated clock and report
    /// what each rule would have refused.
    Simulate(Box<SimulateArgs>),
    /// Who is being limited, in the terminal: a running Tollgate's
    /// /limited, refreshed (Ctrl-C to quit).
    Top(TopArgs),
}

/// `tollgate serve`.
#[derive(Debug, Args, Clone)]
pub(crate) struct ServeArgs {
    /// Rule file or directory; repeat for several. Default: ./examples/rules.
    #[arg(long = "rules", env = "TOLLGATE_RULES", value_delimiter = ',')]
    pub rules: Vec<PathBuf>,

    /// gRPC listen address.
    #[arg(long, env = "TOLLGATE_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    pub grpc_addr: SocketAddr,

    /// How rule files are read.
    #[command(flatten)]
    pub rule_load: RuleLoadArgs,

    /// Add RateLimit, RateLimit-Policy and Retry-After response headers.
    #[arg(long, env = "TOLLGATE_RESPONSE_HEADERS", value_enum, default_value_t = OnOff::On)]
    pub response_headers: OnOff,

    /// The body of every OVER_LIMIT answer, which Envoy sends with its 429:
    /// `json` ({"error":"rate_limited","retry_after_seconds":N,"rule":"NAME"},
    /// content-type application/json) or `none` (Envoy's empty body).
    #[arg(long, env = "TOLLGATE_OVER_LIMIT_BODY", value_enum, default_value_t = OverLimitBodyArg::None)]
    pub over_limit_body: OverLimitBodyArg,

    /// Answer for limits without `failure_mode` when the store fails.
    #[arg(long, env = "TOLLGATE_FAILURE_MODE", value_enum, default_value_t = FailureModeArg::Allow)]
    pub failure_mode: FailureModeArg,

    /// The most keys the memory store holds; past it, new keys get the
    /// failure mode until old ones expire.
    #[arg(long, env = "TOLLGATE_MAX_KEYS", default_value_t = 20_000_000, value_parser = at_least_one)]
    pub max_keys: usize,

    /// Worker threads, each with its own runtime and listener. Default: one per core.
    #[arg(long, env = "TOLLGATE_WORKERS", value_parser = at_least_one)]
    pub workers: Option<usize>,

    /// Most descriptors in one request; more is refused as INVALID_ARGUMENT.
    #[arg(long, env = "TOLLGATE_MAX_DESCRIPTORS", default_value_t = 128, value_parser = at_least_one)]
    pub max_descriptors: usize,

    /// Most entries in one descriptor; more is refused as INVALID_ARGUMENT.
    #[arg(long, env = "TOLLGATE_MAX_ENTRIES", default_value_t = 32, value_parser = at_least_one)]
    pub max_entries: usize,

    /// Longest domain, descriptor key or value in bytes as sent (a value
    /// that is not UTF-8 counts its bytes, not its escaped text); longer is
    /// refused as INVALID_ARGUMENT.
    #[arg(long, env = "TOLLGATE_MAX_VALUE_BYTES", default_value_t = 65_536, value_parser = at_least_one)]
    pub max_value_bytes: usize,

    /// Largest request message in bytes (gRPC and /json); larger is refused
    /// before it is decoded.
    #[arg(long, env = "TOLLGATE_MAX_REQUEST_BYTES", default_value_t = 131_072, value_parser = at_least_one)]
    pub max_request_bytes: usize,

    /// Most limit checks one request may need (its descriptors' limits
    /// together); one request is one Redis script call, which holds Redis
    /// while it runs.
    #[arg(long, env = "TOLLGATE_MAX_CHECKS", default_value_t = 1024, value_parser = at_least_one)]
    pub max_checks: usize,

    /// Longest request ID (`request_id`, `release`, `settle` entries) in
    /// bytes; an in-flight cap or a reservation holds each ID it admits.
    #[arg(long, env = "TOLLGATE_MAX_REQUEST_ID_BYTES", default_value_t = 256, value_parser = at_least_one)]
    pub max_request_id_bytes: usize,

    /// Most open gRPC connections (all workers); past it new ones are closed at once.
    #[arg(long, env = "TOLLGATE_MAX_CONNECTIONS", default_value_t = 10_000, value_parser = at_least_one)]
    pub max_connections: usize,

    /// Most concurrent calls (HTTP/2 streams) on one gRPC connection.
    #[arg(long, env = "TOLLGATE_MAX_STREAMS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams: u32,

    /// Time a new gRPC connection has to send the HTTP/2 preface.
    #[arg(long, env = "TOLLGATE_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,

    /// A gRPC connection with no call in flight for this long is closed
    /// gracefully (Envoy reconnects on its next call).
    #[arg(long, env = "TOLLGATE_IDLE_TIMEOUT", default_value = "60m", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// HTTP/2 PING interval on gRPC connections; a peer that does not answer
    /// within the same time is dropped. `off` saves a clock read per frame
    /// (about 2 % of a call's CPU); dead peers are then found by --idle-timeout.
    #[arg(long, env = "TOLLGATE_KEEPALIVE", default_value = "30s", value_parser = parse_keepalive)]
    pub keepalive: Keepalive,

    /// Longest one gRPC call may take, reading its body included; past it
    /// the call ends with DEADLINE_EXCEEDED.
    #[arg(long, env = "TOLLGATE_REQUEST_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// Host names the admin port answers to besides IP addresses and
    /// localhost (a defence against DNS rebinding); `*` answers any.
    #[arg(long, env = "TOLLGATE_ADMIN_HOSTS", value_delimiter = ',')]
    pub admin_hosts: Vec<String>,

    /// Serve `POST /json` (decisions that spend budgets) on the admin port.
    #[arg(long, env = "TOLLGATE_ADMIN_JSON", value_enum, default_value_t = OnOff::On)]
    pub admin_json: OnOff,

    /// Most open admin HTTP connections; past it a new one closes the one
    /// idle the longest, or is closed at once when every one is busy.
    #[arg(long, env = "TOLLGATE_MAX_ADMIN_CONNECTIONS", default_value_t = 64, value_parser = at_least_one)]
    pub max_admin_connections: usize,

    /// Longest an admin HTTP connection stays open (headers, body, response).
    #[arg(long, env = "TOLLGATE_ADMIN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub admin_timeout: Duration,

    /// PEM certificate chain for TLS on the gRPC and admin listeners (with --tls-key).
    #[arg(long, env = "TOLLGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert.
    #[arg(long, env = "TOLLGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates: clients must present a certificate signed by one
    /// (mutual TLS), on gRPC and admin alike. Needs --tls-cert.
    #[arg(long, env = "TOLLGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// A DNS name or IP address client certificates must carry in their
    /// SAN (beyond chaining to --tls-client-ca).
    #[arg(long, env = "TOLLGATE_TLS_CLIENT_SAN", requires = "tls_client_ca")]
    pub tls_client_san: Option<String>,

    /// Whether the admin listeners serve TLS too when --tls-cert is given
    /// (`off`: TLS on gRPC only, as the reference's GRPC_SERVER_USE_TLS does,
    /// so plain HTTP health probes keep working).
    #[arg(long, env = "TOLLGATE_ADMIN_TLS", value_enum, default_value_t = OnOff::On)]
    pub admin_tls: OnOff,

    /// Most metric label sets made from request keys or values (limits sent
    /// in requests, `detailed_metric`); past it hits count in one overflow series.
    #[arg(long, env = "TOLLGATE_MAX_METRIC_SERIES", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_metric_series: u64,

    /// Longest metric label value made from a request, in bytes (cut beyond).
    #[arg(long, env = "TOLLGATE_MAX_LABEL_BYTES", default_value_t = 128, value_parser = at_least_one)]
    pub max_label_bytes: usize,

    /// Where counters live.
    #[arg(long, env = "TOLLGATE_STORE", value_enum, default_value_t = StoreKind::Memory)]
    pub store: StoreKind,

    /// Redis URL (`redis://[user:password@]host:port[/db]`, `rediss://` for
    /// TLS); for a cluster, a comma-separated list of seed nodes.
    #[arg(
        long,
        env = "TOLLGATE_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis_url: RedisUrl,

    /// PEM CA certificates to trust for `rediss://` (a private CA) instead
    /// of the system's.
    #[arg(long, env = "TOLLGATE_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<PathBuf>,

    /// A second Redis for limits whose period is one second (the reference's
    /// REDIS_PERSECOND): `redis://...`, or seed nodes with
    /// --redis-per-second-store redis-cluster. Same timeout, prefix and TLS
    /// files as the main one.
    #[arg(long, env = "TOLLGATE_REDIS_PER_SECOND_URL")]
    pub redis_per_second_url: Option<RedisUrl>,

    /// `redis` or `redis-cluster`: what --redis-per-second-url is.
    #[arg(long, env = "TOLLGATE_REDIS_PER_SECOND_STORE", value_enum, default_value_t = StoreKind::Redis)]
    pub redis_per_second_store: StoreKind,

    /// With --store redis-sentinel: the master's name as the sentinels know it.
    #[arg(long, env = "TOLLGATE_REDIS_SENTINEL_MASTER")]
    pub redis_sentinel_master: Option<String>,

    /// With --store redis-sentinel: the master's password (`password` or
    /// `user:password`); the sentinels' own go in their --redis-url entries.
    #[arg(long, env = "TOLLGATE_REDIS_MASTER_AUTH")]
    pub redis_master_auth: Option<RedisUrl>,

    /// PEM client certificate for `rediss://` (mutual TLS), with --redis-tls-key.
    #[arg(long, env = "TOLLGATE_REDIS_TLS_CERT", requires = "redis_tls_key")]
    pub redis_tls_cert: Option<PathBuf>,

    /// Its PEM private key.
    #[arg(long, env = "TOLLGATE_REDIS_TLS_KEY", requires = "redis_tls_cert")]
    pub redis_tls_key: Option<PathBuf>,

    /// Longest a request waits for Redis, from when it asks. Sized to what
    /// Redis takes at saturation on a busy node (loadtest/redis-saturation.sh:
    /// 10ms fails open under load alone); give Envoy's filter a longer one.
    #[arg(long, env = "TOLLGATE_REDIS_TIMEOUT", default_value = "100ms", value_parser = parse_duration)]
    pub redis_timeout: Duration,

    /// Prefix of every Redis key.
    #[arg(long, env = "TOLLGATE_REDIS_PREFIX", default_value = "tollgate:")]
    pub redis_prefix: String,

    /// How long the PING that confirms a Redis outage may take (connecting
    /// included): a Redis slower than --redis-timeout under load but
    /// answering within this is not down, and the circuit stays closed.
    #[arg(long, env = "TOLLGATE_REDIS_PROBE_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub redis_probe_timeout: Duration,

    /// Redis failures in a row after which Tollgate stops waiting on Redis
    /// and probes it in the background.
    #[arg(long, env = "TOLLGATE_REDIS_BREAKER", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub redis_breaker: u32,

    /// Most concurrent requests one Redis script call decides together
    /// (requests that arrive while a call is in flight share the next one;
    /// 1 sends each request alone). Bounds how long one call holds Redis.
    #[arg(long, env = "TOLLGATE_REDIS_BATCH", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub redis_batch: u32,

    /// The most memory kept for releases (an in-flight cap's `release`, a
    /// budget's `settle`) Redis could not take while it was down, each
    /// sent once Redis answers again so its slot or reservation is freed
    /// then rather than at `max_hold_seconds` or its window's end (an entry
    /// is about 310 bytes with short keys and IDs). Past it a release frees
    /// nothing until then; 0 keeps none; at most 1GiB.
    #[arg(long, env = "TOLLGATE_REDIS_MAX_OWED_BYTES", default_value = "16MiB", value_parser = values::parse_owed_bytes)]
    pub redis_max_owed_bytes: usize,

    /// Answer keys known to be over their limit from memory until they reset.
    #[arg(long, env = "TOLLGATE_OVER_LIMIT_CACHE", value_enum, default_value_t = OnOff::Off)]
    pub over_limit_cache: OnOff,

    /// On a store failure: apply each rule's failure mode, or answer gRPC
    /// UNAVAILABLE as the reference does (Envoy's failure_mode_deny decides).
    #[arg(long, env = "TOLLGATE_ON_STORE_ERROR", value_enum, default_value_t = OnStoreError::FailureMode)]
    pub on_store_error: OnStoreError,

    /// Tollgate instances sharing the store; the `local` failure mode allows
    /// requests_per_unit / instances per instance.
    #[arg(long, env = "TOLLGATE_INSTANCES", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub instances: u32,

    /// Admin HTTP address (/healthcheck, /metrics, /json, /rlconfig);
    /// repeatable. The reference's PORT and DEBUG_PORT also open one each.
    #[arg(
        long,
        env = "TOLLGATE_ADMIN_ADDR",
        value_delimiter = ',',
        default_value = "127.0.0.1:6070"
    )]
    pub admin_addr: Vec<SocketAddr>,

    /// Watch the rules path and reload on change (SIGHUP always reloads).
    #[arg(long, env = "TOLLGATE_WATCH_RULES", value_enum, default_value_t = OnOff::On)]
    pub watch_rules: OnOff,

    /// How often the rules path is checked for changes.
    #[arg(long, env = "TOLLGATE_WATCH_INTERVAL", default_value = "250ms", value_parser = parse_duration)]
    pub watch_interval: Duration,

    /// Report every over-limit decision as OK (still counted in metrics).
    #[arg(long, env = "TOLLGATE_SHADOW_MODE")]
    pub shadow_mode: bool,

    /// Treat every descriptor as `quota_mode: true`: a request is refused
    /// only when all of its limited descriptors are over (the reference's
    /// QUOTA_MODE=true is also honoured).
    #[arg(long, env = "TOLLGATE_QUOTA_MODE")]
    pub quota_mode: bool,

    /// Candidate rules (file or directory; repeatable): evaluated beside the
    /// live rules for every request on their own memory store, never
    /// changing the answer; see /candidate and the tollgate_candidate_*
    /// metrics. Reloaded like the live rules.
    #[arg(
        long = "candidate-rules",
        env = "TOLLGATE_CANDIDATE_RULES",
        value_delimiter = ','
    )]
    pub candidate_rules: Vec<PathBuf>,

    /// Rules over xDS.
    #[command(flatten)]
    pub xds: XdsArgs,
    /// Who is being limited: /limited, /counters, /ui.
    #[command(flatten)]
    pub limited: LimitedArgs,
    /// The reference's stats.
    #[command(flatten)]
    pub stats: StatsArgs,
    /// Tracing.
    #[command(flatten)]
    pub otel: OtelArgs,
    /// Quota service (RLQS).
    #[command(flatten)]
    pub rlqs: RlqsArgs,
    /// The memory store's data directory.
    #[command(flatten)]
    pub data: DataArgs,

    /// Admitted hits above this share of a limit count as near the limit.
    #[arg(long, env = "TOLLGATE_NEAR_LIMIT_RATIO", default_value_t = 0.8)]
    pub near_limit_ratio: f64,

    /// On SIGTERM, how long health checks fail before the listeners close, so
    /// load balancers drain this instance first.
    #[arg(long, env = "TOLLGATE_SHUTDOWN_DELAY", default_value = "1s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    /// Log filter (tracing syntax, e.g. `info` or `tollgate=debug`).
    #[arg(long, env = "TOLLGATE_LOG_LEVEL", default_value = "info", value_parser = values::parse_log_filter)]
    pub log_level: String,

    /// Log format.
    #[arg(long, env = "TOLLGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// `tollgate check`.
#[derive(Debug, Args, Clone)]
pub(crate) struct CheckArgs {
    /// Rule files or directories.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// How rule files are read.
    #[command(flatten)]
    pub rule_load: RuleLoadArgs,
    /// The rules in force (files or directories): warn about every rule
    /// whose counters the new rules would restart (a new algorithm, period
    /// or zone).
    #[arg(long)]
    pub against: Vec<PathBuf>,
    /// An Envoy configuration (YAML or JSON) whose rate limit actions the
    /// rules are checked against: rules no route can reach, and
    /// descriptors a route sends that no rule limits (its filter's domain
    /// and stage).
    #[arg(long, value_name = "ENVOY.yaml")]
    pub envoy_config: Option<PathBuf>,
    /// With --envoy-config: a rule with a limit that no route can reach is
    /// an error (exit 1) or a warning.
    #[arg(long, value_enum, default_value_t = Severity::Error, requires = "envoy_config")]
    pub unreached_rules: Severity,
    /// With --envoy-config: a descriptor a route sends that no rule limits
    /// is a warning or an error (exit 1).
    #[arg(long, value_enum, default_value_t = Severity::Warning, requires = "envoy_config")]
    pub unlimited_descriptors: Severity,
}

/// How `tollgate check` treats a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Severity {
    /// Printed, and `check` exits 1.
    Error,
    /// Printed; `check` still exits 0.
    Warning,
}

impl ServeArgs {
    /// The rule paths, defaulting to the bundled examples.
    pub(crate) fn rule_paths(&self) -> Vec<PathBuf> {
        if self.rules.is_empty() {
            vec![PathBuf::from("examples/rules")]
        } else {
            self.rules.clone()
        }
    }

    /// How rules are loaded.
    pub(crate) fn load_options(&self) -> LoadOptions {
        self.rule_load.load_options()
    }
}

impl CheckArgs {
    /// How rules are loaded.
    pub(crate) fn load_options(&self) -> LoadOptions {
        self.rule_load.load_options()
    }
}
