//! The parts of an Envoy configuration the importer reads: the rate limit
//! filter, the route table, the access log's format, the regexes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The parts of an Envoy configuration the importer uses.
#[derive(Debug)]
pub(crate) struct EnvoyConfig {
    pub(super) path: PathBuf,
    pub(super) domain: String,
    pub(super) stage: u64,
    pub(super) filter_rate_limits: Option<Vec<Value>>,
    pub(super) virtual_hosts: Vec<Value>,
    /// The access log's `json_format`: each key's command operator as
    /// written (`None` for a value that is not a string).
    pub(super) json_format: Option<BTreeMap<String, Option<String>>>,
    /// The access log's text format as written; `None`: Envoy's default.
    pub(super) text_format: Option<String>,
    pub(super) local_cluster: Option<String>,
    /// The configuration's `safe_regex` patterns, compiled.
    pub(super) regexes: HashMap<String, regex::Regex>,
}

/// Every object in `value` (depth first) that has `key`.
pub(super) fn find_all<'a>(value: &'a Value, key: &str, out: &mut Vec<&'a Value>) {
    match value {
        Value::Object(map) => {
            if map.contains_key(key) {
                out.push(value);
            }
            for v in map.values() {
                find_all(v, key, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| find_all(v, key, out)),
        _ => {}
    }
}

/// The most bytes of an Envoy configuration read.
const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// A protobuf integer as JSON may write it: a number, or a string of one.
pub(super) fn uint(value: &Value) -> Option<u64> {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
}

impl EnvoyConfig {
    /// Reads `path` (YAML or JSON). The first HTTP connection manager with
    /// a rate limit filter is the one used.
    pub(crate) fn load(path: &Path) -> Result<Self, String> {
        Self::load_all(path)?
            .into_iter()
            .next()
            .ok_or_else(|| no_filter(path))
    }

    /// Every rate limit filter of every HTTP connection manager of `path`,
    /// each with its manager's routes: what `tollgate check --envoy-config`
    /// reads (a second listener, or a second filter at another stage, sends
    /// descriptors of its own).
    pub(crate) fn load_all(path: &Path) -> Result<Vec<Self>, String> {
        let file = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !file.is_file() {
            return Err(format!("{}: not a regular file", path.display()));
        }
        if file.len() > MAX_CONFIG_BYTES {
            return Err(format!(
                "{}: {} bytes, more than the {MAX_CONFIG_BYTES} an Envoy configuration is read up to",
                path.display(),
                file.len()
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let config: Value = serde_saphyr::from_str(&text)
            .map_err(|e| format!("{}: not an Envoy configuration: {e}", path.display()))?;
        let mut managers = Vec::new();
        find_all(&config, "http_filters", &mut managers);
        let is_ratelimit = |f: &&Value| {
            f["name"] == "envoy.filters.http.ratelimit"
                || f["typed_config"]["@type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("ratelimit.v3.RateLimit"))
        };
        let mut all = Vec::new();
        for manager in managers {
            let filters = manager["http_filters"].as_array().into_iter().flatten();
            for filter in filters.filter(is_ratelimit) {
                all.push(Self::of(path, &config, manager, filter)?);
            }
        }
        if all.is_empty() {
            return Err(no_filter(path));
        }
        Ok(all)
    }

    /// One rate limit `filter` of `manager` in `config`.
    fn of(path: &Path, config: &Value, manager: &Value, filter: &Value) -> Result<Self, String> {
        let filter = &filter["typed_config"];
        let domain = filter["domain"]
            .as_str()
            .ok_or_else(|| {
                format!(
                    "{}: the rate limit filter has no domain (a string)",
                    path.display()
                )
            })?
            .to_owned();
        let virtual_hosts = manager["route_config"]["virtual_hosts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        // An empty list is the same as none (protobuf): the routes' apply.
        let filter_rate_limits = filter["rate_limits"]
            .as_array()
            .filter(|l| !l.is_empty())
            .cloned();
        if virtual_hosts.is_empty() && filter_rate_limits.is_none() {
            return Err(format!(
                "{}: no inline route_config with virtual_hosts (RDS routes cannot be read from a file)",
                path.display()
            ));
        }
        let mut logs = Vec::new();
        find_all(manager, "access_log", &mut logs);
        let log = logs
            .first()
            .and_then(|m| m["access_log"].as_array())
            .and_then(|a| a.first());
        let format = log.map(|l| &l["typed_config"]["log_format"]);
        let json_format = format.and_then(|f| f["json_format"].as_object()).map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().map(str::to_owned)))
                .collect()
        });
        let text_format = format
            .and_then(|f| {
                f["text_format_source"]["inline_string"]
                    .as_str()
                    .or(f["text_format"].as_str())
            })
            .map(str::to_owned);
        // Envoy's source cluster is the node's (or --service-cluster).
        let local_cluster = config["node"]["cluster"]
            .as_str()
            .or(config["cluster_manager"]["local_cluster_name"].as_str())
            .map(str::to_owned);
        let regexes = regexes(manager).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            regexes,
            domain,
            stage: uint(&filter["stage"]).unwrap_or(0),
            filter_rate_limits,
            virtual_hosts,
            json_format,
            text_format,
            local_cluster,
        })
    }
}

/// The error for a configuration without the filter.
fn no_filter(path: &Path) -> String {
    format!(
        "{}: no HTTP connection manager with the rate limit filter (envoy.filters.http.ratelimit)",
        path.display()
    )
}

/// Every `safe_regex` under `value`, compiled once (whole-value matches, as
/// Envoy's); an error names the pattern the `regex` crate refuses.
pub(super) fn regexes(value: &Value) -> Result<HashMap<String, regex::Regex>, String> {
    let mut found = Vec::new();
    find_all(value, "safe_regex", &mut found);
    let mut compiled = HashMap::new();
    for holder in found {
        let Some(pattern) = holder["safe_regex"]["regex"].as_str() else {
            continue;
        };
        if compiled.contains_key(pattern) {
            continue;
        }
        let re = regex::Regex::new(&format!("^(?:{pattern})$"))
            .map_err(|e| format!("safe_regex '{pattern}' cannot be read: {e}"))?;
        compiled.insert(pattern.to_owned(), re);
    }
    Ok(compiled)
}
