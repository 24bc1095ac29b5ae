//! A statsd-exporter mapping file (the reference's `PROMETHEUS_MAPPER_YAML`,
//! Envoy Gateway's `statsd_conf.yaml`) applied to the reference's stat
//! names, and the Prometheus exposition that results.
//!
//! What is supported, as statsd_exporter does it: `mappings` tried in order,
//! the first that matches wins; `match` as a glob (`*` matches within one
//! dot-separated part, the whole name must match) or, with
//! `match_type: regex`, a regular expression; `name` and `labels` with
//! `$1`/`${1}` (or named) captures; `action: drop`; `match_metric_type`
//! (counter, gauge, observer/timer/histogram/distribution); `help`; and
//! `defaults.match_type`. A stat no mapping matches is exported under its
//! name with every character outside `[a-zA-Z0-9_:]` made `_`. Stats that map
//! to one series add up (counters) as they do in statsd_exporter. Timers are
//! histograms with Tollgate's buckets, in seconds, whatever `timer_type`,
//! `observer_type`, `buckets` or `quantiles` say (accepted, no effect).
//! Any other key is refused by name.

use std::collections::BTreeMap;
use std::fmt::Write;

use regex::Regex;
use serde::Deserialize;

use super::{Stat, StatValue};
use crate::metrics::exposition::{self, Exposition};
use crate::metrics::label_value;

/// Settings statsd_exporter has that change how timers are observed; they
/// are accepted and have no effect here (see the module docs).
const NO_EFFECT: &[&str] = &[
    "timer_type",
    "observer_type",
    "buckets",
    "quantiles",
    "histogram_options",
    "summary_options",
    "honor_labels",
    "scale",
];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    defaults: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    mappings: Vec<BTreeMap<String, serde_json::Value>>,
}

/// Which stats a mapping applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Counter,
    Gauge,
    Timer,
}

#[derive(Debug)]
struct Mapping {
    pattern: Regex,
    name: Option<String>,
    labels: Vec<(String, String)>,
    drop: bool,
    kind: Option<Kind>,
    help: Option<String>,
}

/// Where a stat goes: `None` when dropped; else the metric name, its
/// labels (rendered) and its help.
type Mapped = Option<(String, String, Option<String>)>;

/// Names whose mapping is remembered; past it the memory starts over (the
/// stat names are the limits' own, so this is reached only by a rule set of
/// that many limits).
const MAP_CACHE: usize = 100_000;

/// A loaded mapping file.
#[derive(Debug, Default)]
pub(crate) struct Mapper {
    mappings: Vec<Mapping>,
    /// Each stat name's mapping, found once (as statsd_exporter caches
    /// them): a scrape walks the mappings only for names it has not seen.
    cache: parking_lot::Mutex<std::collections::HashMap<(Kind, String), Mapped>>,
    /// Names mapped by walking the mappings (cache misses), for tests.
    walked: std::sync::atomic::AtomicU64,
}

fn text(value: &serde_json::Value, what: &str) -> Result<String, String> {
    match value {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        serde_json::Value::Bool(b) => Ok(b.to_string()),
        other => Err(format!("{what}: expected text, got {other}")),
    }
}

/// A glob as an anchored regex: `*` captures within one part.
fn glob(pattern: &str) -> String {
    let mut out = String::from("^");
    for (i, part) in pattern.split('*').enumerate() {
        if i > 0 {
            out.push_str("([^.]*)");
        }
        out.push_str(&regex::escape(part));
    }
    out.push('$');
    out
}

/// A Prometheus metric name: characters outside `[a-zA-Z0-9_:]` become `_`,
/// and a leading digit gets a `_` before it.
pub(crate) fn escape_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

impl Mapper {
    /// Parses a mapping file; the error names the mapping and the problem.
    pub(crate) fn parse(text_in: &str) -> Result<Self, String> {
        let spec: FileSpec = serde_saphyr::from_str(text_in)
            .map_err(|e| format!("not a statsd mapping file: {e}"))?;
        let default_type = match spec.defaults.get("match_type") {
            Some(v) => text(v, "defaults.match_type")?,
            None => "glob".into(),
        };
        for key in spec.defaults.keys() {
            if key != "match_type"
                && key != "glob_disable_ordering"
                && key != "ttl"
                && !NO_EFFECT.contains(&key.as_str())
            {
                return Err(format!(
                    "defaults.{key}: not supported by Tollgate's statsd mapping"
                ));
            }
        }
        let mut mappings = Vec::new();
        for (i, m) in spec.mappings.iter().enumerate() {
            let at = |field: &str| format!("mappings[{i}].{field}");
            for key in m.keys() {
                let known = matches!(
                    key.as_str(),
                    "match"
                        | "match_type"
                        | "name"
                        | "labels"
                        | "action"
                        | "match_metric_type"
                        | "help"
                ) || NO_EFFECT.contains(&key.as_str());
                if !known {
                    return Err(format!(
                        "{}: not supported by Tollgate's statsd mapping",
                        at(key)
                    ));
                }
            }
            let pattern = text(
                m.get("match")
                    .ok_or_else(|| format!("{}: missing", at("match")))?,
                &at("match"),
            )?;
            let match_type = match m.get("match_type") {
                Some(v) => text(v, &at("match_type"))?,
                None => default_type.clone(),
            };
            let regex = match match_type.as_str() {
                "glob" => glob(&pattern),
                "regex" => pattern.clone(),
                other => return Err(format!("{}: {other} (glob or regex)", at("match_type"))),
            };
            let pattern = Regex::new(&regex).map_err(|e| format!("{}: {e}", at("match")))?;
            let drop = match m
                .get("action")
                .map(|v| text(v, &at("action")))
                .transpose()?
                .as_deref()
            {
                None | Some("map") => false,
                Some("drop") => true,
                Some(other) => return Err(format!("{}: {other} (map or drop)", at("action"))),
            };
            let kind = match m
                .get("match_metric_type")
                .map(|v| text(v, &at("match_metric_type")))
                .transpose()?
                .as_deref()
            {
                None => None,
                Some("counter") => Some(Kind::Counter),
                Some("gauge") => Some(Kind::Gauge),
                Some("observer" | "timer" | "histogram" | "distribution" | "summary") => {
                    Some(Kind::Timer)
                }
                Some(other) => return Err(format!("{}: {other}", at("match_metric_type"))),
            };
            let name = m.get("name").map(|v| text(v, &at("name"))).transpose()?;
            if name.is_none() && !drop {
                return Err(format!(
                    "{}: missing (only a drop mapping may leave it out)",
                    at("name")
                ));
            }
            let mut labels = Vec::new();
            if let Some(map) = m.get("labels") {
                let serde_json::Value::Object(map) = map else {
                    return Err(format!("{}: expected a map", at("labels")));
                };
                for (k, v) in map {
                    labels.push((k.clone(), text(v, &at(&format!("labels.{k}")))?));
                }
            }
            let help = m.get("help").map(|v| text(v, &at("help"))).transpose()?;
            mappings.push(Mapping {
                pattern,
                name,
                labels,
                drop,
                kind,
                help,
            });
        }
        Ok(Self {
            mappings,
            ..Self::default()
        })
    }

    /// Where a stat goes, from the cache or found and remembered there.
    fn map_cached(
        &self,
        cache: &mut std::collections::HashMap<(Kind, String), Mapped>,
        name: &str,
        kind: Kind,
    ) -> Mapped {
        let key = (kind, name.to_owned());
        if let Some(mapped) = cache.get(&key) {
            return mapped.clone();
        }
        self.walked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mapped = self.map(name, kind);
        if cache.len() >= MAP_CACHE {
            cache.clear();
        }
        cache.insert(key, mapped.clone());
        mapped
    }

    /// Where a stat goes: `None` when dropped; else the metric name, its
    /// labels (rendered) and its help.
    fn map(&self, name: &str, kind: Kind) -> Mapped {
        for m in &self.mappings {
            if m.kind.is_some_and(|k| k != kind) {
                continue;
            }
            let Some(captures) = m.pattern.captures(name) else {
                continue;
            };
            if m.drop {
                return None;
            }
            let mut metric = String::new();
            captures.expand(m.name.as_deref().unwrap_or_default(), &mut metric);
            let mut labels = String::new();
            for (label, template) in &m.labels {
                let mut value = String::new();
                captures.expand(template, &mut value);
                if !labels.is_empty() {
                    labels.push(',');
                }
                let _ = write!(labels, "{}=\"", escape_name(label));
                label_value(&mut labels, &value);
                labels.push('"');
            }
            return Some((escape_name(&metric), labels, m.help.clone()));
        }
        Some((escape_name(name), String::new(), None))
    }

    /// The Prometheus exposition of `stats` through the mappings.
    pub(crate) fn render(&self, stats: &[Stat<'_>]) -> String {
        // name -> (kind, help, labels -> value or histogram)
        let mut series: BTreeMap<String, Family<'_>> = BTreeMap::new();
        let mut cache = self.cache.lock();
        for stat in stats {
            let kind = match stat.value {
                StatValue::Counter(_) => Kind::Counter,
                StatValue::Timer(_) => Kind::Timer,
            };
            let Some((name, labels, help)) = self.map_cached(&mut cache, &stat.name, kind) else {
                continue;
            };
            let entry = series
                .entry(name)
                .or_insert_with(|| (kind, help, BTreeMap::new()));
            if entry.0 != kind {
                // statsd_exporter refuses a second type under one name too.
                continue;
            }
            match (&stat.value, entry.2.entry(labels)) {
                (StatValue::Counter(v), std::collections::btree_map::Entry::Occupied(mut e)) => {
                    if let Series::Counter(total) = e.get_mut() {
                        *total += v;
                    }
                }
                (StatValue::Counter(v), std::collections::btree_map::Entry::Vacant(e)) => {
                    e.insert(Series::Counter(*v));
                }
                (StatValue::Timer(h), std::collections::btree_map::Entry::Vacant(e)) => {
                    e.insert(Series::Timer(h));
                }
                (StatValue::Timer(_), std::collections::btree_map::Entry::Occupied(_)) => {}
            }
        }
        drop(cache);
        let mut out = String::new();
        for (name, (kind, help, all)) in &series {
            let help = help
                .as_deref()
                .unwrap_or("Metric autogenerated by statsd_exporter.");
            let kind = if *kind == Kind::Timer {
                exposition::Kind::Histogram
            } else {
                exposition::Kind::Counter
            };
            Exposition::new(&mut out).family(name, help, kind);
            for (labels, value) in all {
                match value {
                    Series::Counter(v) => {
                        Exposition::new(&mut out).sample(name, labels, v);
                    }
                    Series::Timer(h) => h.write_series(&mut out, name, labels),
                }
            }
        }
        out
    }
}

/// One metric's series: its kind, help and values by label set.
type Family<'a> = (Kind, Option<String>, BTreeMap<String, Series<'a>>);

enum Series<'a> {
    Counter(u64),
    Timer(&'a crate::metrics::Histogram),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Histogram;

    const MAPPING: &str = r#"
defaults:
  timer_type: histogram
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "rl_total_hits"
    timer_type: histogram
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.total_hits"
    match_type: regex
    name: "rl_total_hits"
    labels: {domain: "$1", key1: "$2", key2: "${3}"}
  - match: "ratelimit_server.*.response_time"
    name: "rl_response_time_seconds"
    timer_type: histogram
    labels: {grpc_method: "$1"}
  - match: "ratelimit_server.*.total_requests"
    name: "rl_total_requests"
    match_metric_type: counter
    labels: {grpc_method: "$1"}
  - match: "ratelimit.service.config_load_*"
    action: drop
"#;

    fn counter(name: &str, v: u64) -> Stat<'static> {
        Stat {
            name: name.into(),
            value: StatValue::Counter(v),
        }
    }

    #[test]
    fn globs_regexes_captures_drops_and_sums() {
        let mapper = Mapper::parse(MAPPING).expect("parses");
        let h = Histogram::default();
        h.observe(0.001);
        let stats = vec![
            counter("ratelimit.service.rate_limit.gw.user.total_hits", 4),
            counter(
                "ratelimit.service.rate_limit.gw.path_/login.remote_address.total_hits",
                2,
            ),
            // A third level maps onto the same series as the second: summed.
            counter(
                "ratelimit.service.rate_limit.gw.path_/login.remote_address.x.total_hits",
                5,
            ),
            counter("ratelimit_server.ShouldRateLimit.total_requests", 11),
            counter("ratelimit.service.config_load_success", 1),
            counter("ratelimit.service.call.should_rate_limit.redis_error", 0),
            Stat {
                name: "ratelimit_server.ShouldRateLimit.response_time".into(),
                value: StatValue::Timer(&h),
            },
        ];
        let text = mapper.render(&stats);
        // Issue 33: each name is mapped once, then remembered: the next
        // scrape walks no mapping and answers the same.
        let walked = mapper.walked.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(walked, stats.len() as u64);
        assert_eq!(mapper.render(&stats), text);
        assert_eq!(
            mapper.walked.load(std::sync::atomic::Ordering::Relaxed),
            walked,
            "the second scrape found every name in the cache"
        );
        assert!(text.contains("# TYPE rl_total_hits counter\n"), "{text}");
        assert!(
            text.contains(r#"rl_total_hits{domain="gw",key1="user"} 4"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"rl_total_hits{domain="gw",key1="path_/login",key2="remote_address"} 7"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"rl_total_requests{grpc_method="ShouldRateLimit"} 11"#),
            "{text}"
        );
        assert!(
            text.contains("# TYPE rl_response_time_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains(r#"rl_response_time_seconds_count{grpc_method="ShouldRateLimit"} 1"#),
            "{text}"
        );
        assert!(!text.contains("config_load"), "dropped: {text}");
        // Unmatched: the name, escaped.
        assert!(
            text.contains("ratelimit_service_call_should_rate_limit_redis_error 0"),
            "{text}"
        );
    }

    #[test]
    fn a_metric_type_filter_skips_other_types() {
        let mapper = Mapper::parse(
            "mappings:\n  - match: \"a.*\"\n    name: \"only_counters\"\n    match_metric_type: counter\n",
        )
        .expect("parses");
        let h = Histogram::default();
        let text = mapper.render(&[Stat {
            name: "a.b".into(),
            value: StatValue::Timer(&h),
        }]);
        assert!(text.contains("# TYPE a_b histogram"), "{text}");
    }

    #[test]
    fn mistakes_are_named() {
        for (file, needle) in [
            (
                "mappings:\n  - match: \"a.*\"\n    name: x\n    ttl: 5m\n",
                "mappings[0].ttl",
            ),
            (
                "mappings:\n  - match: \"a.(\"\n    match_type: regex\n    name: x\n",
                "mappings[0].match",
            ),
            ("mappings:\n  - match: \"a.*\"\n", "mappings[0].name"),
            (
                "mappings:\n  - match: \"a.*\"\n    name: x\n    action: keep\n",
                "mappings[0].action",
            ),
            ("mapings: []\n", "not a statsd mapping file"),
        ] {
            let error = Mapper::parse(file).expect_err(file);
            assert!(error.contains(needle), "{file}: {error}");
        }
    }
}
