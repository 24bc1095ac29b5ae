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

mod access_log;
mod actions;
mod config;
pub(crate) mod coverage;
mod routing;

use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::path::Path;

use serde_json::Value;

use access_log::LogFormat;
use actions::descriptor;
use routing::route;

pub(crate) use config::EnvoyConfig;

use super::traffic::{Event, Strings, parse_time};

/// The requests of access log `path`, as `config`'s rate limit filter would
/// have described them, and notes on what could not be read: each kind of
/// problem once, with how many lines it affected.
pub(crate) fn import(
    config: &EnvoyConfig,
    path: &Path,
) -> Result<(Vec<Event>, Vec<String>), String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let format = LogFormat::from(config);
    let recorded = format.recorded();
    let mut events = Vec::new();
    let mut strings = Strings::default();
    let domain = strings.get(&config.domain);
    let mut problems: BTreeMap<String, u64> = BTreeMap::new();
    let (mut unreadable, mut no_call, mut not_utf8) = (0u64, 0u64, 0u64);
    let mut reader = std::io::BufReader::new(file);
    let mut bytes = Vec::new();
    for i in 1.. {
        bytes.clear();
        let read = reader
            .read_until(b'\n', &mut bytes)
            .map_err(|e| format!("{}:{i}: {e}", path.display()))?;
        if read == 0 {
            break;
        }
        // A byte that is not UTF-8 costs its line nothing but that byte
        // (read as U+FFFD), never the import.
        let line = match std::str::from_utf8(&bytes) {
            Ok(text) => std::borrow::Cow::Borrowed(text),
            Err(_) => {
                not_utf8 += 1;
                String::from_utf8_lossy(&bytes)
            }
        };
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        let Some(logged) = format.read(line) else {
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
            if config::uint(&policy["stage"]).unwrap_or(0) != config.stage {
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
    if not_utf8 > 0 {
        notes.push(format!(
            "{}: {not_utf8} lines held bytes that are not UTF-8 (read with U+FFFD in their place)",
            path.display()
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
    use super::access_log::{DEFAULT_FORMAT, Field, read_text, template};
    use super::actions::masked;
    use super::routing::domain_matches;
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
    fn a_byte_that_is_not_utf8_costs_its_line_nothing_but_that_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (c, l) = (dir.path().join("envoy.yaml"), dir.path().join("access.log"));
        std::fs::write(&c, JSON_CONFIG).expect("write");
        let mut log =
            br#"{"time":"2026-01-01T00:00:01Z","client":"10.0.0.1:5","path":"/v1/x","key":"k"}"#
                .to_vec();
        log.extend_from_slice(b"\n");
        log.extend_from_slice(
            br#"{"time":"2026-01-01T00:00:02Z","client":"10.0.0.1:5","path":"/v1/x","key":"k"#,
        );
        log.push(0xff);
        log.extend_from_slice(br#""}"#);
        log.extend_from_slice(b"\n");
        std::fs::write(&l, log).expect("write");
        let config = EnvoyConfig::load(&c).expect("loads");
        let (events, notes) = import(&config, &l).expect("imports, whatever the bytes");
        assert_eq!(events.len(), 2, "{notes:?}");
        assert!(
            notes
                .iter()
                .any(|n| n.contains("1 lines held bytes that are not UTF-8")),
            "{notes:?}"
        );
    }

    #[test]
    fn a_start_time_with_its_own_format_is_read() {
        let config = TEXT_CONFIG_WITH_TIME_FORMAT;
        let (events, notes) = import_text(config, "1767225601.250 /v1/x k\n");
        assert_eq!(events.len(), 1, "{notes:?}");
        assert_eq!(events[0].at, 1_767_225_601_250_000_000);
    }

    const TEXT_CONFIG_WITH_TIME_FORMAT: &str = r#"
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
                        text_format_source:
                          inline_string: "%START_TIME(%s.%3f)% %REQ(:PATH)% %REQ(X-API-KEY)%\n"
                route_config:
                  virtual_hosts:
                    - name: api
                      domains: ["*"]
                      routes:
                        - match: { prefix: / }
                          route:
                            cluster: api
                            rate_limits:
                              - actions:
                                  - request_headers: { header_name: x-api-key, descriptor_key: api_key }
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
