//! Tollgate: a rate limit service for Envoy.
//!
//! # Layout
//!
//! Modules follow the path of a request:
//!
//! - [`rls`]: Envoy's `RateLimitService` over gRPC: proto to domain and back.
//! - [`limiter`]: matches a request's descriptors to rules and has the store
//!   decide them together, all or nothing.
//! - [`rules`]: YAML rule files, validated and compiled; descriptor matching.
//! - [`store`]: where counters live: the embedded memory store, or Redis
//!   (standalone, Sentinel, Cluster).
//! - [`period`]: the time units of limits (a leaf: the stores' counter keys
//!   carry one, and need nothing from [`rules`]).
//! - [`algorithm`]: fixed window, sliding window, token bucket; pure, with
//!   time passed in.
//! - [`admin`]: admin HTTP: health, metrics, `/json`, `/rlconfig`.
//! - [`reload`]: hot reload of the rules (file changes and SIGHUP).
//! - [`xds`]: rules from an xDS server (Envoy Gateway's way).
//! - [`logging`]: log output; calls refused at the HTTP/2 level, counted.
//! - [`stats`]: the reference's stat names: statsd output, and a Prometheus
//!   endpoint through a statsd-exporter mapping file.
//! - [`otel`]: OTLP tracing spans for ShouldRateLimit calls.
//! - [`metrics`]: every metric, in the Prometheus text format.
//! - [`calendar`]: calendar windows (days, weeks, months, years) in a time zone.
//! - [`clock`]: the clock trait, the system clock and a manual clock for tests.
//! - [`rlqs`]: Envoy's rate limit quota service (RLQS): shares of a bucket's
//!   rate for Envoys that enforce them locally.
//! - [`simulate`] and [`candidate`]: replaying traffic against rules offline,
//!   and shadow evaluation of candidate rules on live traffic.
//! - [`settings`] and [`server`]: the command line and the process around it.

/// The version, as Cargo.toml says it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit the binary was built from (`unknown` without git).
pub const COMMIT: &str = env!("BUILD_COMMIT");
/// `--version`'s text: the version and the commit.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BUILD_COMMIT"),
    ")"
);

pub mod admin;
pub mod algorithm;
pub mod calendar;
pub mod candidate;
pub mod clock;
pub mod limiter;
pub mod logging;
pub mod metrics;
pub mod otel;
pub mod period;
pub mod reload;
pub mod rlqs;
pub mod rls;
pub mod rules;
pub mod server;
pub mod settings;
pub mod simulate;
pub mod stats;
pub mod store;
pub mod xds;
