//! The value types and parsers of the command line: durations, shares,
//! zones, and the enums behind `value_enum` flags.

use std::time::Duration;

use clap::ValueEnum;

use crate::algorithm::Algorithm;
use crate::calendar::Zone;
use crate::rules::FailureMode;

/// What buckets without a limit get from the quota service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum UnmatchedArg {
    /// Allow every request (`ALLOW_ALL`).
    AllowAll,
    /// Deny every request (`DENY_ALL`).
    DenyAll,
}

/// A duration in whole seconds, at least 1 s (an RLQS assignment's TTL).
pub(super) fn parse_ttl(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.subsec_nanos() != 0 || d.as_secs() == 0 {
        return Err(format!(
            "'{text}' must be whole seconds, at least 1s (Envoy counts TTLs in seconds)"
        ));
    }
    Ok(d)
}

/// A share from 0 to 1.
pub(super) fn parse_share(text: &str) -> Result<f64, String> {
    let share: f64 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    if !(0.0..=1.0).contains(&share) {
        return Err(format!("'{text}' must be from 0 to 1"));
    }
    Ok(share)
}

/// Log formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

pub(super) fn parse_zone(name: &str) -> Result<&'static Zone, String> {
    Zone::get(name)
}

/// `on` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnOff {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// Algorithm names on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AlgorithmArg {
    /// Fixed window.
    #[value(alias = "fixed_window")]
    FixedWindow,
    /// Sliding window counter.
    #[value(alias = "sliding_window")]
    SlidingWindow,
    /// Token bucket (GCRA).
    #[value(alias = "token_bucket")]
    TokenBucket,
    /// Sliding log (exact; limits up to --max-sliding-log).
    #[value(alias = "sliding_log")]
    SlidingLog,
}

impl From<AlgorithmArg> for Algorithm {
    fn from(a: AlgorithmArg) -> Self {
        match a {
            AlgorithmArg::FixedWindow => Algorithm::FixedWindow,
            AlgorithmArg::SlidingWindow => Algorithm::SlidingWindow,
            AlgorithmArg::TokenBucket => Algorithm::TokenBucket,
            AlgorithmArg::SlidingLog => Algorithm::SlidingLog,
        }
    }
}

/// `--over-limit-body` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OverLimitBodyArg {
    /// No body (Envoy's own 429).
    None,
    /// A JSON object naming the wait and the rule.
    Json,
}

impl From<OverLimitBodyArg> for crate::limiter::OverLimitBody {
    fn from(a: OverLimitBodyArg) -> Self {
        match a {
            OverLimitBodyArg::None => Self::None,
            OverLimitBodyArg::Json => Self::Json,
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
    /// An in-process limit of requests_per_unit / --instances.
    Local,
}

/// Where counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StoreKind {
    /// In this process.
    Memory,
    /// One Redis server.
    Redis,
    /// Redis Cluster.
    RedisCluster,
    /// A master found through Redis Sentinel (--redis-url lists the
    /// sentinels; --redis-sentinel-master names the master).
    RedisSentinel,
}

/// What a store failure turns into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnStoreError {
    /// Each rule's failure mode (server default --failure-mode).
    FailureMode,
    /// gRPC UNAVAILABLE, as envoyproxy/ratelimit.
    Unavailable,
}

/// Parses a whole number of at least one.
/// A number from 0 to 1.
pub(super) fn parse_fraction(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    if !(0.0..=1.0).contains(&value) {
        return Err(format!("{value} must be between 0 and 1"));
    }
    Ok(value)
}

/// `--redis-max-owed-bytes`: 0 (keep none), or a size from 1MiB to 1GiB.
pub(super) fn parse_owed_bytes(text: &str) -> Result<usize, String> {
    if text.trim() == "0" {
        return Ok(0);
    }
    let bytes = parse_bytes(text)?;
    if bytes > 1 << 30 {
        return Err(format!("{text}: at most 1GiB"));
    }
    Ok(bytes)
}

/// A size in bytes: a whole number, or one with `KiB`, `MiB` or `GiB`; at
/// least 1 MiB (a bound that small would hold nothing worth showing).
pub(super) fn parse_bytes(text: &str) -> Result<usize, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let scale: usize = match unit.trim() {
        "" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "'{other}' is not a unit of bytes (write a whole number, or one with KiB, MiB or GiB)"
            ));
        }
    };
    let bytes = number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("'{text}' is not a size in bytes"))?;
    if bytes < 1 << 20 {
        return Err(format!("{text}: at least 1MiB"));
    }
    Ok(bytes)
}

pub(super) fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{text}' is not a whole number")),
    }
}

/// The HTTP/2 keepalive interval, or none (`off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Keepalive(pub Option<Duration>);

/// Parses a duration, or `off`.
pub(super) fn parse_keepalive(text: &str) -> Result<Keepalive, String> {
    if text == "off" {
        return Ok(Keepalive(None));
    }
    parse_duration(text).map(|d| Keepalive(Some(d)))
}

/// Parses `250us`, `10ms`, `2s` or `1m`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("'{text}' needs a unit (us, ms, s or m)"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' does not start with a number"))?;
    let seconds = match unit {
        "us" | "µs" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        "m" => value * 60.0,
        _ => {
            return Err(format!(
                "'{text}': unknown unit '{unit}' (use us, ms, s or m)"
            ));
        }
    };
    if seconds <= 0.0 || seconds > 3600.0 {
        return Err(format!("'{text}' must be above zero and at most an hour"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

impl From<FailureModeArg> for FailureMode {
    fn from(m: FailureModeArg) -> Self {
        match m {
            FailureModeArg::Allow => FailureMode::Allow,
            FailureModeArg::Deny => FailureMode::Deny,
            FailureModeArg::Local => FailureMode::Local,
        }
    }
}

/// A log level by one of its names: `off`, `error`, `warn` (or `warning`),
/// `info`, `debug`, `trace`, in any case; `None` for anything else.
fn level_name(text: &str) -> Option<&'static str> {
    Some(match text.trim().to_ascii_lowercase().as_str() {
        "off" => "off",
        "error" => "error",
        "warn" | "warning" => "warn",
        "info" => "info",
        "debug" => "debug",
        "trace" => "trace",
        _ => return None,
    })
}

/// `--log-level`: a level (`info`), or comma-separated directives
/// (`info,tollgate=debug`) whose levels are level names; trimmed. A word that
/// is no level (`verbose`) would be taken by the filter for a target name and
/// silence every line, so it is refused.
pub(crate) fn parse_log_filter(text: &str) -> Result<String, String> {
    let mut out = Vec::new();
    for directive in text.split(',') {
        let directive = directive.trim();
        let normal = match directive.split_once('=') {
            Some((target, level)) if !target.trim().is_empty() => {
                let level = level_name(level).ok_or_else(|| {
                    format!("'{directive}': '{}' is not a log level (error, warn, info, debug, trace, off)", level.trim())
                })?;
                format!("{}={level}", target.trim())
            }
            _ => level_name(directive)
                .ok_or_else(|| {
                    format!(
                        "'{directive}' is not a log level (error, warn, info, debug, trace, off) nor a target=level directive"
                    )
                })?
                .to_owned(),
        };
        out.push(normal);
    }
    Ok(out.join(","))
}

/// envoyproxy/ratelimit's `LOG_LEVEL` (logrus's level names, any case,
/// trimmed) as a level: `panic` and `fatal` log as `error`.
pub(crate) fn reference_log_level(text: &str) -> Result<&'static str, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "panic" | "fatal" => Ok("error"),
        other => level_name(other).filter(|l| *l != "off").ok_or_else(|| {
            format!(
                "LOG_LEVEL={}: expected one of trace, debug, info, warn (warning), error, fatal, panic",
                text.trim()
            )
        }),
    }
}

#[cfg(test)]
mod log_level_tests {
    use super::{parse_log_filter, reference_log_level};

    #[test]
    fn log_levels_are_trimmed_spelled_as_the_reference_and_never_a_silent_target() {
        assert_eq!(parse_log_filter(" info").as_deref(), Ok("info"));
        assert_eq!(parse_log_filter("info ").as_deref(), Ok("info"));
        assert_eq!(parse_log_filter("WARNING").as_deref(), Ok("warn"));
        assert_eq!(
            parse_log_filter("info, tollgate=debug").as_deref(),
            Ok("info,tollgate=debug")
        );
        for bad in ["verbose", "", "tollgate=loud", "=info"] {
            let e = parse_log_filter(bad).expect_err(bad);
            assert!(e.contains("not a log level"), "{bad}: {e}");
        }
        assert_eq!(reference_log_level("warning"), Ok("warn"));
        assert_eq!(reference_log_level(" Info "), Ok("info"));
        assert_eq!(reference_log_level("fatal"), Ok("error"));
        assert_eq!(reference_log_level("panic"), Ok("error"));
        let e = reference_log_level("verbose").expect_err("refused");
        assert!(e.starts_with("LOG_LEVEL=verbose"), "{e}");
        assert!(reference_log_level("off").is_err(), "logrus has no off");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owed_bytes_are_none_or_a_size_from_a_mebibyte_to_a_gibibyte() {
        assert_eq!(parse_owed_bytes("0"), Ok(0));
        assert_eq!(parse_owed_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_owed_bytes("1GiB"), Ok(1 << 30));
        for bad in ["2GiB", "1KiB", "-1", "abc", "", "1e3"] {
            assert!(parse_owed_bytes(bad).is_err(), "{bad}");
        }
    }
}
