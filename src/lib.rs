//! Tollgate: a rate limit service for Envoy.
//!
//! # Layout
//!
//! Modules follow the path of a request:
//!
//! - `rls`: Envoy's `RateLimitService` over gRPC: proto to domain and back.
//! - [`limiter`]: matches a request's descriptors to rules and has the store
//!   decide them together, all or nothing.
//! - [`rules`]: YAML rule files, validated and compiled; descriptor matching.
//! - [`store`]: where counters live: the embedded memory store, or Redis
//!   (standalone, Sentinel, Cluster).
//! - `period`: the time units of limits (a leaf: the stores' counter keys
//!   carry one, and need nothing from [`rules`]).
//! - [`algorithm`]: fixed window, sliding window, token bucket; pure, with
//!   time passed in.
//! - `admin`: admin HTTP: health, metrics, `/json`, `/rlconfig`.
//! - `health`: whether the instance should receive traffic (readiness),
//!   shared by the admin port, gRPC health and the xDS client.
//! - `build_info`: the version and commit the binary was built from.
//! - `reload`: hot reload of the rules (file changes and SIGHUP).
//! - `xds`: rules from an xDS server (Envoy Gateway's way).
//! - `logging`: log output; calls refused at the HTTP/2 level, counted.
//! - `stats`: the reference's stat names: statsd output, and a Prometheus
//!   endpoint through a statsd-exporter mapping file.
//! - `otel`: OTLP tracing spans for ShouldRateLimit calls.
//! - `metrics`: every metric's name and help, and all Prometheus text
//!   (the quota service's and the candidate rules' too).
//! - `calendar`: calendar windows (days, weeks, months, years) in a time zone.
//! - [`clock`]: the clock trait, the system clock and a manual clock for tests.
//! - `shards`: state every worker writes and few read, one shard per thread.
//! - `rlqs`: Envoy's rate limit quota service (RLQS): shares of a bucket's
//!   rate for Envoys that enforce them locally.
//! - `limited`: who is being limited now: per rule, the heaviest refused
//!   clients, bounded (`/limited`, the admin page, `tollgate top`).
//! - `top`: `tollgate top`, who is being limited in a terminal (a client
//!   of the admin port's `/limited`).
//! - `simulate` and `candidate`: replaying traffic against rules offline,
//!   and shadow evaluation of candidate rules on live traffic; `report`:
//!   what both produce, and its summary, series and HTML report.
//! - `settings` and `server`: the command line and the environment, read
//!   once (`settings::load`), and the process around it (with the
//!   `test-util` feature, also inside a test, on its runtime and clock:
//!   `test_util::InProcess`); `cli`: what the `tollgate` binary runs.
//!
//! Five modules are public (`algorithm`, `clock`, `limiter`, `rules`,
//! `store`); the rest are the crate's own, reached through the re-exports
//! below. `docs/ARCHITECTURE.md` draws the layers and a request's path.

// The admin router's handlers hold futures that reach the Redis store's
// layers; proving them `Send + Sync` takes the trait solver past its default
// depth of 128 (E0275 on `post(json)`), and small changes on the reset path
// cross it.
#![recursion_limit = "256"]

// The public surface: the pure algorithms, time, the rules, the limiter and
// the stores, which a program embedding Tollgate's decisions needs; and, at
// the root, what the `tollgate` binary and the load tools run. Everything
// else is the crate's own, so the unreachable-pub and dead-code lints see
// it.
pub mod algorithm;
pub mod clock;
pub mod limiter;
pub mod rules;
pub mod store;

pub(crate) mod admin;
pub(crate) mod build_info;
pub(crate) mod calendar;
pub(crate) mod candidate;
pub(crate) mod cli;
pub(crate) mod health;
pub(crate) mod limited;
pub(crate) mod logging;
pub(crate) mod metrics;
pub(crate) mod otel;
pub(crate) mod period;
pub(crate) mod reload;
pub(crate) mod report;
pub(crate) mod rlqs;
pub(crate) mod rls;
pub(crate) mod server;
pub(crate) mod settings;
pub(crate) mod shards;
pub(crate) mod simulate;
pub(crate) mod stats;
pub(crate) mod top;
pub(crate) mod wire_text;
pub(crate) mod xds;

pub use admin::request_from_json;
pub use build_info::{COMMIT, LONG_VERSION, VERSION};
pub use cli::main;
pub use rls::{UnaryBody, to_domain};
pub use server::{DRAIN_TIMEOUT, LIVENESS_SERVICE, bind_grpc};
pub use settings::Env;

/// What the integration tests drive directly (with the `test-util`
/// feature, which the crate's own dev-dependency turns on): not part of
/// the API.
#[cfg(feature = "test-util")]
pub mod test_util {
    pub use crate::reload::Reloader;
    pub use crate::rlqs::{Answer, Handles, QuotaError, QuotaOptions, Quotas};
    pub use crate::server::InProcess;
    pub use crate::stats::statsd::MAX_DATAGRAM;
    pub use crate::xds::resource::TYPE_URL;
    pub use crate::xds::resource::pb::{
        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    };
}
