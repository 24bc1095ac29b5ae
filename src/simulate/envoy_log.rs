//! Envoy access logs as traffic: each log line becomes the descriptors that
//! Envoy's own rate limit configuration would have sent for that request.
//!
//! The importer reads the user's `envoy.yaml`: the rate limit filter's
//! `domain` and `stage`, its filter-level `rate_limits` if any, the route
//! table (virtual hosts by `domains`, routes by `prefix`, `path` or
//! `safe_regex`, and `headers`), the routes' and virtual hosts' `rate_limits`,
//! and the access log's format (`json_format`, or `text_format_source` /
//! the default text format). A log line's fields are read through that
//! format, so `%REQ(X-API-KEY)%` in the format makes the `x-api-key` header
//! known. Actions: `request_headers`, `remote_address`,
//! `masked_remote_address`, `generic_key`, `header_value_match`,
//! `destination_cluster`, `source_cluster`. What an action needs that the
//! log does not record is reported (as Envoy would, the descriptor is then
//! not sent), never guessed.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::traffic::{Entries, Event, Strings, parse_time};

/// Envoy's default access log format.
pub const DEFAULT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\"\n";

/// What a log field holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Field {
    StartTime,
    /// A request header (lower case; `:path`, `:method`, `:authority` too).
    Header(String),
    /// The client's address (with or without a port).
    RemoteAddress,
    /// Anything else the importer does not use.
    Other,
}

/// A format operator (`%REQ(X-API-KEY)%`) as the field it records.
fn field_of(operator: &str) -> Field {
    let op = operator.trim_matches('%');
    let op = op.split(':').next().unwrap_or(op);
    if op == "START_TIME" || op.starts_with("START_TIME(") {
        return Field::StartTime;
    }
    if matches!(
        op,
        "DOWNSTREAM_REMOTE_ADDRESS"
            | "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT"
            | "DOWNSTREAM_DIRECT_REMOTE_ADDRESS"
            | "DOWNSTREAM_DIRECT_REMOTE_ADDRESS_WITHOUT_PORT"
    ) {
        return Field::RemoteAddress;
    }
    let inner = operator
        .trim_matches('%')
        .strip_prefix("REQ(")
        .and_then(|r| r.split(')').next());
    match inner {
        // `X-ENVOY-ORIGINAL-PATH?:PATH`: the original path, else :path.
        Some(names) => {
            let name = names.rsplit('?').next().unwrap_or(names);
            Field::Header(name.to_ascii_lowercase())
        }
        None => Field::Other,
    }
}

/// A text format as literals and fields.
fn template(format: &str) -> Vec<(String, Field)> {
    // (literal before, field); the last literal comes with Field::Other.
    let mut parts = Vec::new();
    let mut rest = format;
    let mut literal = String::new();
    while let Some(start) = rest.find('%') {
        let Some(len) = rest[start + 1..].find('%') else {
            break;
        };
        literal.push_str(&rest[..start]);
        let operator = &rest[start..start + len + 2];
        parts.push((std::mem::take(&mut literal), field_of(operator)));
        rest = &rest[start + len + 2..];
    }
    literal.push_str(rest.trim_end_matches('\n'));
    parts.push((literal, Field::Other));
    parts
}

/// The fields of a text log line read through `template`.
fn read_text(template: &[(String, Field)], line: &str) -> Option<Vec<(Field, String)>> {
    let mut out = Vec::new();
    let mut rest = line.strip_prefix(template.first()?.0.as_str())?;
    for (i, (_, field)) in template.iter().enumerate() {
        let Some((next, _)) = template.get(i + 1) else {
            break;
        };
        let end = if next.is_empty() {
            rest.len()
        } else {
            rest.find(next.as_str())?
        };
        out.push((field.clone(), rest[..end].to_owned()));
        rest = &rest[end + next.len()..];
    }
    Some(out)
}

/// One request as a log line recorded it.
#[derive(Debug, Default)]
struct Logged {
    time: Option<String>,
    headers: HashMap<String, String>,
    remote: Option<String>,
}

/// The parts of an Envoy configuration the importer uses.
#[derive(Debug)]
pub struct EnvoyConfig {
    path: PathBuf,
    domain: String,
    stage: u64,
    filter_rate_limits: Option<Vec<Value>>,
    virtual_hosts: Vec<Value>,
    json_format: Option<BTreeMap<String, Field>>,
    text_format: String,
    local_cluster: Option<String>,
    /// The configuration's `safe_regex` patterns, compiled.
    regexes: HashMap<String, regex::Regex>,
}

/// Every object in `value` (depth first) that has `key`.
fn find_all<'a>(value: &'a Value, key: &str, out: &mut Vec<&'a Value>) {
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

impl EnvoyConfig {
    /// Reads `path` (YAML or JSON). The first HTTP connection manager with
    /// a rate limit filter is the one used.
    pub fn load(path: &Path) -> Result<Self, String> {
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
        let (manager, filter) = managers
            .iter()
            .find_map(|m| {
                let filters = m["http_filters"].as_array()?;
                filters.iter().find(is_ratelimit).map(|f| (*m, f))
            })
            .ok_or_else(|| {
                format!(
                    "{}: no HTTP connection manager with the rate limit filter (envoy.filters.http.ratelimit)",
                    path.display()
                )
            })?;
        let filter = &filter["typed_config"];
        let domain = filter["domain"]
            .as_str()
            .ok_or_else(|| format!("{}: the rate limit filter has no domain", path.display()))?
            .to_owned();
        let virtual_hosts = manager["route_config"]["virtual_hosts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if virtual_hosts.is_empty() && filter["rate_limits"].as_array().is_none() {
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
                .map(|(k, v)| (k.clone(), v.as_str().map_or(Field::Other, field_of)))
                .collect()
        });
        let text_format = format
            .and_then(|f| {
                f["text_format_source"]["inline_string"]
                    .as_str()
                    .or(f["text_format"].as_str())
            })
            .unwrap_or(DEFAULT_FORMAT)
            .to_owned();
        let local_cluster = config["cluster_manager"]["local_cluster_name"]
            .as_str()
            .or(config["node"]["cluster"].as_str())
            .map(str::to_owned);
        let regexes = regexes(manager).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            regexes,
            domain,
            stage: filter["stage"].as_u64().unwrap_or(0),
            filter_rate_limits: filter["rate_limits"].as_array().cloned(),
            virtual_hosts,
            json_format,
            text_format,
            local_cluster,
        })
    }

    /// The fields a log line has, by what they record.
    fn logged(&self, line: &str, template: &[(String, Field)]) -> Option<Logged> {
        let fields: Vec<(Field, String)> = if line.trim_start().starts_with('{') {
            let object: serde_json::Map<String, Value> = serde_json::from_str(line).ok()?;
            object
                .into_iter()
                .map(|(k, v)| {
                    let field = match &self.json_format {
                        Some(format) => format.get(&k).cloned().unwrap_or(Field::Other),
                        // No json_format in the configuration: Envoy's own
                        // names for the usual operators.
                        None => conventional_field(&k),
                    };
                    let text = match v {
                        Value::String(s) => s,
                        Value::Null => "-".into(),
                        other => other.to_string(),
                    };
                    (field, text)
                })
                .collect()
        } else {
            read_text(template, line)?
        };
        let mut logged = Logged::default();
        for (field, value) in fields {
            // Envoy writes "-" for a value it does not have.
            let value = (value != "-" && !value.is_empty()).then_some(value);
            match field {
                Field::StartTime => logged.time = value,
                Field::Header(name) => {
                    if let Some(v) = value {
                        logged.headers.insert(name, v);
                    } else {
                        logged.headers.entry(name).or_default();
                    }
                }
                Field::RemoteAddress => logged.remote = value,
                Field::Other => {}
            }
        }
        Some(logged)
    }

    /// Which headers the log records at all (whether or not a line has one).
    fn recorded(&self) -> Vec<Field> {
        match &self.json_format {
            Some(format) => format.values().cloned().collect(),
            None => template(&self.text_format)
                .into_iter()
                .map(|(_, f)| f)
                .collect(),
        }
    }
}

/// Field names for JSON logs whose format is not in the configuration.
fn conventional_field(key: &str) -> Field {
    match key {
        "start_time" | "timestamp" | "time" => Field::StartTime,
        "method" => Field::Header(":method".into()),
        "path" => Field::Header(":path".into()),
        "authority" | "host" => Field::Header(":authority".into()),
        "downstream_remote_address" | "remote_address" | "client_ip" => Field::RemoteAddress,
        "x_forwarded_for" => Field::Header("x-forwarded-for".into()),
        "user_agent" => Field::Header("user-agent".into()),
        "request_id" => Field::Header("x-request-id".into()),
        _ => Field::Other,
    }
}

/// Whether a virtual host's `domains` pattern matches `host` (port removed).
fn domain_matches(pattern: &str, host: &str) -> bool {
    let host = host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    if pattern == "*" {
        return true;
    }
    if let Some(suffix) = pattern.strip_prefix('*') {
        return host.ends_with(suffix);
    }
    if let Some(prefix) = pattern.strip_suffix('*') {
        return host.starts_with(prefix);
    }
    pattern.eq_ignore_ascii_case(host)
}

/// Whether a string matcher (`exact`, `prefix`, `suffix`, `contains`,
/// `safe_regex`) matches; `None` when it is of a kind not supported.
fn string_matches(config: &EnvoyConfig, matcher: &Value, value: &str) -> Option<bool> {
    if let Some(re) = matcher["safe_regex"]["regex"].as_str() {
        return config.regexes.get(re).map(|re| re.is_match(value));
    }
    let fold = matcher["ignore_case"].as_bool().unwrap_or(false);
    fn lower(s: &str, fold: bool) -> std::borrow::Cow<'_, str> {
        if fold {
            std::borrow::Cow::Owned(s.to_ascii_lowercase())
        } else {
            std::borrow::Cow::Borrowed(s)
        }
    }
    let v = lower(value, fold);
    let arg = |k: &str| matcher[k].as_str().map(|s| lower(s, fold));
    if let Some(e) = arg("exact") {
        return Some(v == e);
    }
    if let Some(p) = arg("prefix") {
        return Some(v.starts_with(&*p));
    }
    if let Some(s) = arg("suffix") {
        return Some(v.ends_with(&*s));
    }
    if let Some(c) = arg("contains") {
        return Some(v.contains(&*c));
    }
    None
}

/// Every `safe_regex` under `value`, compiled once (whole-value matches, as
/// Envoy's); an error names the pattern the `regex` crate refuses.
fn regexes(value: &Value) -> Result<HashMap<String, regex::Regex>, String> {
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

/// Envoy's HeaderMatcher against a logged request; `Err` names what the log
/// lacks or what is not supported.
fn header_matches(
    config: &EnvoyConfig,
    matcher: &Value,
    logged: &Logged,
    recorded: &[Field],
) -> Result<bool, String> {
    let name = matcher["name"].as_str().unwrap_or("").to_ascii_lowercase();
    if !recorded.contains(&Field::Header(name.clone())) {
        return Err(format!(
            "header '{name}' (the access log does not record it: add %REQ({name})% to its format)"
        ));
    }
    let value = logged.headers.get(&name).filter(|v| !v.is_empty());
    let invert = matcher["invert_match"].as_bool().unwrap_or(false);
    let matched = if let Some(present) = matcher["present_match"].as_bool() {
        value.is_some() == present
    } else if let Some(value) = value {
        if let Some(e) = matcher["exact_match"].as_str() {
            value == e
        } else if let Some(p) = matcher["prefix_match"].as_str() {
            value.starts_with(p)
        } else if let Some(s) = matcher["suffix_match"].as_str() {
            value.ends_with(s)
        } else if matcher["string_match"].is_object() {
            string_matches(config, &matcher["string_match"], value)
                .ok_or_else(|| format!("a string_match on '{name}' of a kind not supported"))?
        } else {
            // No condition: presence.
            true
        }
    } else {
        false
    };
    Ok(matched != invert)
}

/// The route a request takes: `(route, virtual host)`.
fn route<'a>(
    config: &'a EnvoyConfig,
    logged: &Logged,
    recorded: &[Field],
) -> Result<Option<(&'a Value, &'a Value)>, String> {
    let host = logged
        .headers
        .get(":authority")
        .cloned()
        .unwrap_or_default();
    let path = logged.headers.get(":path").cloned().unwrap_or_default();
    let path_only = path.split('?').next().unwrap_or("");
    let Some(vhost) = config.virtual_hosts.iter().find(|v| {
        v["domains"].as_array().is_some_and(|d| {
            d.iter()
                .filter_map(Value::as_str)
                .any(|p| domain_matches(p, &host))
        })
    }) else {
        return Ok(None);
    };
    for route in vhost["routes"].as_array().into_iter().flatten() {
        let m = &route["match"];
        let path_ok = if let Some(p) = m["prefix"].as_str() {
            path_only.starts_with(p)
        } else if let Some(p) = m["path"].as_str() {
            path_only == p
        } else if let Some(p) = m["path_separated_prefix"].as_str() {
            path_only == p || path_only.starts_with(&format!("{p}/"))
        } else if m["safe_regex"].is_object() {
            string_matches(config, m, path_only).unwrap_or(false)
        } else {
            return Err("a route match of a kind not supported (prefix, path, path_separated_prefix and safe_regex are)".into());
        };
        if !path_ok {
            continue;
        }
        let mut headers_ok = true;
        for h in m["headers"].as_array().into_iter().flatten() {
            headers_ok &= header_matches(config, h, logged, recorded)?;
        }
        if headers_ok {
            return Ok(Some((route, vhost)));
        }
    }
    Ok(None)
}

/// A client address masked to `bits` (IPv4) or `bits6` (IPv6): `10.1.2.0/24`.
fn masked(address: &str, bits: u32, bits6: u32) -> Option<String> {
    let ip: std::net::IpAddr = address.parse().ok()?;
    Some(match ip {
        std::net::IpAddr::V4(v4) => {
            let bits = bits.min(32);
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            format!("{}/{bits}", std::net::Ipv4Addr::from(u32::from(v4) & mask))
        }
        std::net::IpAddr::V6(v6) => {
            let bits = bits6.min(128);
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            format!("{}/{bits}", std::net::Ipv6Addr::from(u128::from(v6) & mask))
        }
    })
}

/// The client's address: the logged downstream address without its port,
/// else the first X-Forwarded-For entry.
fn client_address(logged: &Logged) -> Option<String> {
    if let Some(remote) = &logged.remote {
        let host = match remote.parse::<std::net::SocketAddr>() {
            Ok(sa) => sa.ip().to_string(),
            Err(_) => remote.clone(),
        };
        return Some(host);
    }
    logged
        .headers
        .get("x-forwarded-for")
        .and_then(|x| x.split(',').next())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// One `rate_limits` entry's descriptor for a request; `Ok(None)` when an
/// action does not apply (Envoy then sends no descriptor for it), `Err` when
/// the log lacks what an action needs.
fn descriptor(
    config: &EnvoyConfig,
    rate_limit: &Value,
    logged: &Logged,
    recorded: &[Field],
    cluster: Option<&str>,
    strings: &mut Strings,
) -> Result<Option<Entries>, String> {
    let mut entries = Entries::new();
    for action in rate_limit["actions"].as_array().into_iter().flatten() {
        let Some((kind, a)) = action.as_object().and_then(|o| o.iter().next()) else {
            continue;
        };
        let entry: Option<(String, String)> = match kind.as_str() {
            "request_headers" => {
                let name = a["header_name"].as_str().unwrap_or("").to_ascii_lowercase();
                if !recorded.contains(&Field::Header(name.clone())) {
                    return Err(format!(
                        "request_headers '{name}': the access log does not record it (add %REQ({name})% to its format)"
                    ));
                }
                match logged.headers.get(&name).filter(|v| !v.is_empty()) {
                    Some(v) => Some((
                        a["descriptor_key"].as_str().unwrap_or(&name).to_owned(),
                        v.clone(),
                    )),
                    None if a["skip_if_absent"].as_bool().unwrap_or(false) => continue,
                    None => return Ok(None),
                }
            }
            "remote_address" => {
                if !recorded.contains(&Field::RemoteAddress)
                    && !recorded.contains(&Field::Header("x-forwarded-for".into()))
                {
                    return Err("remote_address: the access log records neither %DOWNSTREAM_REMOTE_ADDRESS% nor X-Forwarded-For".into());
                }
                let Some(address) = client_address(logged) else {
                    return Ok(None);
                };
                Some(("remote_address".into(), address))
            }
            "masked_remote_address" => {
                let Some(address) = client_address(logged) else {
                    return Err(
                        "masked_remote_address: the access log records no client address".into(),
                    );
                };
                let v4 = a["v4_prefix_mask_len"].as_u64().unwrap_or(32) as u32;
                let v6 = a["v6_prefix_mask_len"].as_u64().unwrap_or(128) as u32;
                masked(&address, v4, v6).map(|m| ("masked_remote_address".into(), m))
            }
            "generic_key" => Some((
                a["descriptor_key"]
                    .as_str()
                    .unwrap_or("generic_key")
                    .to_owned(),
                a["descriptor_value"].as_str().unwrap_or("").to_owned(),
            )),
            "header_value_match" => {
                let mut all = true;
                for h in a["headers"].as_array().into_iter().flatten() {
                    all &= header_matches(config, h, logged, recorded)?;
                }
                if all != a["expect_match"].as_bool().unwrap_or(true) {
                    return Ok(None);
                }
                Some((
                    a["descriptor_key"]
                        .as_str()
                        .unwrap_or("header_match")
                        .to_owned(),
                    a["descriptor_value"].as_str().unwrap_or("").to_owned(),
                ))
            }
            "destination_cluster" => {
                let Some(cluster) = cluster else {
                    return Err("destination_cluster: the route has no single cluster".into());
                };
                Some(("destination_cluster".into(), cluster.to_owned()))
            }
            "source_cluster" => {
                match &config.local_cluster {
                    Some(c) => Some(("source_cluster".into(), c.clone())),
                    None => {
                        return Err("source_cluster: the configuration names no local cluster (node.cluster)".into());
                    }
                }
            }
            other => return Err(format!("action '{other}' is not supported by the importer")),
        };
        if let Some((k, v)) = entry {
            entries.push((strings.get(&k), strings.get(&v)));
        }
    }
    Ok((!entries.is_empty()).then_some(entries))
}

/// The requests of access log `path`, as `config`'s rate limit filter would
/// have described them, and notes on what could not be read: each kind of
/// problem once, with how many lines it affected.
pub fn import(config: &EnvoyConfig, path: &Path) -> Result<(Vec<Event>, Vec<String>), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let template = template(&config.text_format);
    let recorded = config.recorded();
    let mut events = Vec::new();
    let mut strings = Strings::default();
    let domain = strings.get(&config.domain);
    let mut problems: BTreeMap<String, u64> = BTreeMap::new();
    let (mut unreadable, mut no_call) = (0u64, 0u64);
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let Some(logged) = config.logged(&line, &template) else {
            unreadable += 1;
            continue;
        };
        let Some(at) = logged.time.as_deref().and_then(|t| parse_time(t).ok()) else {
            *problems
                .entry("a line without a readable start time (%START_TIME%)".into())
                .or_default() += 1;
            continue;
        };
        let routed = match &config.filter_rate_limits {
            Some(_) => route(config, &logged, &recorded).unwrap_or(None),
            None => match route(config, &logged, &recorded) {
                Ok(r) => r,
                Err(e) => {
                    *problems.entry(e).or_default() += 1;
                    continue;
                }
            },
        };
        let cluster = routed.and_then(|(r, _)| r["route"]["cluster"].as_str());
        // Filter-level rate_limits replace the routes'; otherwise the
        // route's, with the virtual host's when the route asks for them or
        // has none of its own.
        let policies: Vec<&Value> = match &config.filter_rate_limits {
            Some(limits) => limits.iter().collect(),
            None => match routed {
                None => Vec::new(),
                Some((r, vhost)) => {
                    let own = r["route"]["rate_limits"].as_array();
                    let include = r["route"]["include_vh_rate_limits"]
                        .as_bool()
                        .unwrap_or(false);
                    let mut all: Vec<&Value> = own.into_iter().flatten().collect();
                    if include || own.is_none_or(|o| o.is_empty()) {
                        all.extend(vhost["rate_limits"].as_array().into_iter().flatten());
                    }
                    all
                }
            },
        };
        let mut descriptors = super::traffic::Descriptors::new();
        for policy in policies {
            if policy["stage"].as_u64().unwrap_or(0) != config.stage {
                continue;
            }
            match descriptor(config, policy, &logged, &recorded, cluster, &mut strings) {
                Ok(Some(d)) => descriptors.push(d),
                Ok(None) => {}
                Err(e) => *problems.entry(e).or_default() += 1,
            }
        }
        if descriptors.is_empty() {
            // Envoy makes no call for a request without descriptors.
            no_call += 1;
            continue;
        }
        events.push(Event {
            at,
            domain: domain.clone(),
            descriptors,
            hits: 0,
        });
    }
    let mut notes: Vec<String> = problems
        .into_iter()
        .map(|(p, n)| format!("{}: {p} ({n} lines)", path.display()))
        .collect();
    if unreadable > 0 {
        notes.push(format!(
            "{}: {unreadable} lines do not follow the access log format of {}",
            path.display(),
            config.path.display()
        ));
    }
    if no_call > 0 {
        notes.push(format!(
            "{}: {no_call} requests had no descriptors (Envoy makes no rate limit call for them)",
            path.display()
        ));
    }
    Ok((events, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_text_format_reads_back() {
        let t = template(DEFAULT_FORMAT);
        let line = r#"[2026-01-01T00:00:01.250Z] "GET /api/items?x=1 HTTP/1.1" 200 - 0 12 3 2 "10.0.0.7" "curl/8" "abc" "api.example.com" "10.1.0.3:8080""#;
        let fields = read_text(&t, line).expect("reads");
        let get = |f: Field| {
            fields
                .iter()
                .find(|(g, _)| *g == f)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get(Field::StartTime), Some("2026-01-01T00:00:01.250Z"));
        assert_eq!(get(Field::Header(":path".into())), Some("/api/items?x=1"));
        assert_eq!(
            get(Field::Header("x-forwarded-for".into())),
            Some("10.0.0.7")
        );
        assert_eq!(
            get(Field::Header(":authority".into())),
            Some("api.example.com")
        );
        assert!(read_text(&t, "not a log line").is_none());
    }

    /// `config` in a file, and `log` through it.
    fn import_text(config: &str, log: &str) -> (Vec<Event>, Vec<String>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (c, l) = (dir.path().join("envoy.yaml"), dir.path().join("access.log"));
        std::fs::write(&c, config).expect("write");
        std::fs::write(&l, log).expect("write");
        let config = EnvoyConfig::load(&c).expect("loads");
        import(&config, &l).expect("imports")
    }

    fn descriptors(e: &Event) -> Vec<Vec<(String, String)>> {
        e.descriptors
            .iter()
            .map(|d| {
                d.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .collect()
    }

    const JSON_CONFIG: &str = r#"
static_resources:
  listeners:
    - filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                access_log:
                  - name: envoy.access_loggers.file
                    typed_config:
                      log_format:
                        json_format:
                          time: "%START_TIME%"
                          client: "%DOWNSTREAM_REMOTE_ADDRESS%"
                          path: "%REQ(:PATH)%"
                          key: "%REQ(X-API-KEY)%"
                          host: "%REQ(:AUTHORITY)%"
                route_config:
                  virtual_hosts:
                    - name: admin
                      domains: ["admin.example.com"]
                      rate_limits:
                        - actions: [{ generic_key: { descriptor_value: admin } }]
                      routes:
                        - match: { prefix: / }
                          route: { cluster: admin }
                    - name: api
                      domains: ["*"]
                      routes:
                        - match: { safe_regex: { regex: "/v[0-9]+/.*" } }
                          route:
                            cluster: api_v
                            rate_limits:
                              - actions:
                                  - request_headers: { header_name: x-api-key, descriptor_key: api_key }
                              - actions:
                                  - masked_remote_address: { v4_prefix_mask_len: 24 }
                              - actions:
                                  - destination_cluster: {}
                              - actions:
                                  - query_parameter_value_match: { descriptor_value: q, query_parameters: [] }
                              - stage: 1
                                actions: [{ generic_key: { descriptor_value: later } }]
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: api
"#;

    #[test]
    fn json_logs_are_read_through_the_configured_format() {
        let log = r#"{"time":"2026-01-01T00:00:00Z","client":"10.1.2.3:5555","path":"/v1/items?x=1","key":"k1","host":"api.example.com"}
{"time":"2026-01-01T00:00:01Z","client":"10.1.2.4:5555","path":"/v2/items","key":"-","host":"api.example.com"}
{"time":"2026-01-01T00:00:02Z","client":"10.1.2.5:5555","path":"/other","key":"k2","host":"api.example.com"}
{"time":"2026-01-01T00:00:03Z","client":"10.9.9.9:1","path":"/","key":"k3","host":"admin.example.com"}
not json at all
"#;
        let (events, notes) = import_text(JSON_CONFIG, log);
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(&*events[0].domain, "api");
        assert_eq!(events[0].at, 1_767_225_600 * 1_000_000_000);
        let pair = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        assert_eq!(
            descriptors(&events[0]),
            vec![
                pair("api_key", "k1"),
                pair("masked_remote_address", "10.1.2.0/24"),
                pair("destination_cluster", "api_v")
            ]
        );
        // No x-api-key on this request: Envoy sends no api_key descriptor.
        assert_eq!(
            descriptors(&events[1]),
            vec![
                pair("masked_remote_address", "10.1.2.0/24"),
                pair("destination_cluster", "api_v")
            ]
        );
        // The virtual host's rate_limits apply to a route without its own.
        assert_eq!(descriptors(&events[2]), vec![pair("generic_key", "admin")]);
        let notes = notes.join("\n");
        assert!(
            notes.contains("action 'query_parameter_value_match' is not supported"),
            "{notes}"
        );
        assert!(
            notes.contains("1 lines do not follow the access log format"),
            "{notes}"
        );
        assert!(notes.contains("1 requests had no descriptors"), "{notes}");
    }

    #[test]
    fn filter_level_rate_limits_replace_the_routes() {
        let config = JSON_CONFIG.replace(
            "                      domain: api\n",
            "                      domain: api\n                      rate_limits:\n                        - actions: [{ remote_address: {} }]\n",
        );
        let log = r#"{"time":"2026-01-01T00:00:00Z","client":"10.1.2.3:5555","path":"/v1/items","key":"k1","host":"api.example.com"}
"#;
        let (events, _) = import_text(&config, log);
        assert_eq!(
            descriptors(&events[0]),
            vec![vec![("remote_address".to_owned(), "10.1.2.3".to_owned())]]
        );
    }

    #[test]
    fn a_regex_the_importer_cannot_read_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = dir.path().join("envoy.yaml");
        std::fs::write(&c, JSON_CONFIG.replace("/v[0-9]+/.*", "/v[0-9+/.*")).expect("write");
        let e = EnvoyConfig::load(&c).expect_err("bad regex");
        assert!(
            e.contains("envoy.yaml") && e.contains("safe_regex '/v[0-9+/.*'"),
            "{e}"
        );
    }

    #[test]
    fn a_configuration_without_the_filter_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = dir.path().join("envoy.yaml");
        std::fs::write(&c, "static_resources: {}\n").expect("write");
        let e = EnvoyConfig::load(&c).expect_err("no filter");
        assert!(
            e.contains("envoy.yaml") && e.contains("envoy.filters.http.ratelimit"),
            "{e}"
        );
    }

    #[test]
    fn addresses_mask_and_domains_match() {
        assert_eq!(masked("10.1.2.3", 24, 128).as_deref(), Some("10.1.2.0/24"));
        assert_eq!(
            masked("2001:db8::1", 32, 64).as_deref(),
            Some("2001:db8::/64")
        );
        assert!(domain_matches("*.example.com", "api.example.com:443"));
        assert!(domain_matches("*", "anything"));
        assert!(!domain_matches("api.example.com", "www.example.com"));
    }
}
