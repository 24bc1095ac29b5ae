//! Metrics the way the reference exports them, for tools built on its stat
//! names: statsd output (`ratelimit.service.rate_limit.<domain>.<keys>.<stat>`,
//! `ratelimit_server.ShouldRateLimit.*`, ...) and a Prometheus endpoint
//! that turns those names into series through a statsd-exporter mapping
//! file, as the reference's `USE_PROMETHEUS` does (and Envoy Gateway's
//! dashboards expect). Tollgate's own `/metrics` is unchanged.

pub(crate) mod mapper;
pub(crate) mod statsd;

use crate::metrics::{Histogram, Metrics};

/// A stat's value.
#[derive(Debug)]
pub(crate) enum StatValue<'a> {
    /// A counter: its total so far.
    Counter(u64),
    /// A timer (seconds).
    Timer(&'a Histogram),
}

/// One stat under the reference's name.
#[derive(Debug)]
pub(crate) struct Stat<'a> {
    /// The statsd name.
    pub name: String,
    /// Its value.
    pub value: StatValue<'a>,
}

/// The name of the ShouldRateLimit response time timer.
pub(crate) const RESPONSE_TIME: &str = "ratelimit_server.ShouldRateLimit.response_time";

/// Every stat of `metrics` under the reference's names.
pub(crate) fn reference_stats(metrics: &Metrics) -> Vec<Stat<'_>> {
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = Vec::new();
    metrics.for_each_limit(|labels, stats| {
        let path = if labels.starts_with("overflow=") {
            "overflow".to_owned()
        } else {
            stat_path(labels)
        };
        for (stat, value) in [
            ("total_hits", &stats.total_hits),
            ("over_limit", &stats.over_limit),
            ("near_limit", &stats.near_limit),
            ("within_limit", &stats.within_limit),
            ("shadow_mode", &stats.shadow_mode),
        ] {
            out.push(Stat {
                name: format!("ratelimit.service.rate_limit.{path}.{stat}"),
                value: StatValue::Counter(value.load(Relaxed)),
            });
        }
    });
    let counters = [
        (
            "ratelimit.service.call.should_rate_limit.redis_error",
            metrics.unavailable.load(Relaxed),
        ),
        (
            "ratelimit.service.call.should_rate_limit.service_error",
            metrics.invalid_argument.load(Relaxed),
        ),
        (
            "ratelimit_server.ShouldRateLimit.total_requests",
            metrics.response_time.count(),
        ),
        (
            "ratelimit.service.config_load_success",
            metrics.config_load_success.load(Relaxed),
        ),
        (
            "ratelimit.service.config_load_error",
            metrics.config_load_error.load(Relaxed),
        ),
    ];
    for (name, value) in counters {
        out.push(Stat {
            name: name.into(),
            value: StatValue::Counter(value),
        });
    }
    out.push(Stat {
        name: RESPONSE_TIME.into(),
        value: StatValue::Timer(&metrics.response_time),
    });
    out
}

/// A character of a stat name as statsd may carry it: `:` and `|` (which end
/// a statsd name and its value) become `_`, as the reference's
/// `SanitizeStatName` does, and so does any control character (a newline
/// would start a statsd line of its own).
fn stat_char(c: char) -> char {
    if c == ':' || c == '|' || c.is_control() {
        '_'
    } else {
        c
    }
}

/// `domain.key1.key2...` from a label set `domain="d",key1="a_b",...` (the
/// values in order, unescaped, each character through [`stat_char`]): the
/// reference's stat path of a limit.
pub(crate) fn stat_path(labels: &str) -> String {
    let mut out = String::new();
    let mut chars = labels.chars();
    // name="value" pairs separated by commas; values escape \ " and \n.
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        if !out.is_empty() {
            out.push('.');
        }
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => out.push(stat_char('\n')),
                    Some(other) => out.push(stat_char(other)),
                    None => {}
                },
                other => out.push(stat_char(other)),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor value cannot forge statsd lines: with `detailed_metric`
    /// values go into stat names, so `x.over_limit:1000000|c` or a newline
    /// would add increments or lines of their own at the statsd server.
    #[test]
    fn stat_paths_cannot_carry_statsd_syntax() {
        assert_eq!(
            stat_path(r#"domain="d",key1="k_x.over_limit:1000000|c:0""#),
            "d.k_x.over_limit_1000000_c_0"
        );
        assert_eq!(
            stat_path("domain=\"d\",key1=\"a\\nb.total_hits:5|c\u{1}\""),
            "d.a_b.total_hits_5_c_"
        );
    }

    #[test]
    fn stat_paths_are_the_label_values_in_order() {
        assert_eq!(
            stat_path(r#"domain="gw",key1="path_/login",key2="remote_address""#),
            "gw.path_/login.remote_address"
        );
        assert_eq!(stat_path(r#"domain="a\"b",key1="c\\d""#), "a\"b.c\\d");
    }

    #[test]
    fn every_reference_name_is_there() {
        let metrics = Metrics::new(10, 64);
        let stats = metrics.limit(r#"domain="gw",key1="user""#);
        stats
            .total_hits
            .fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        metrics.response_time.observe(0.002);
        let names: Vec<(String, Option<u64>)> = reference_stats(&metrics)
            .into_iter()
            .map(|s| {
                let v = match s.value {
                    StatValue::Counter(v) => Some(v),
                    StatValue::Timer(_) => None,
                };
                (s.name, v)
            })
            .collect();
        for (name, value) in [
            ("ratelimit.service.rate_limit.gw.user.total_hits", Some(3)),
            ("ratelimit.service.rate_limit.gw.user.over_limit", Some(0)),
            ("ratelimit_server.ShouldRateLimit.total_requests", Some(1)),
            ("ratelimit_server.ShouldRateLimit.response_time", None),
            ("ratelimit.service.config_load_success", Some(0)),
        ] {
            assert!(
                names.contains(&(name.to_owned(), value)),
                "{name}: {names:?}"
            );
        }
    }
}
