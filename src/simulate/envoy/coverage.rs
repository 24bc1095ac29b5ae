//! `tollgate check RULES --envoy-config envoy.yaml`: the rules and Envoy's
//! rate limit actions, each side checked against the other. Every
//! descriptor a route can send is worked out from its actions (a header's
//! or an address's value is unknown: any value), then walked through the
//! rule tree as the matcher walks it. A rule with a limit that no route can
//! reach limits nothing (a key Envoy never sends: `apikey` for `api_key`);
//! a descriptor no rule limits is sent for nothing.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::Value;

use super::config::EnvoyConfig;
use crate::rules::{Rule, RuleSet};

/// One entry of a descriptor a route sends: its key, and its value when the
/// configuration fixes it.
type Entry = (String, Option<String>);

/// What the cross-check found.
#[derive(Debug, Default)]
pub(crate) struct Coverage {
    /// Rules with a limit no route of the configuration can reach, each
    /// `file:line: ...`.
    pub(crate) unsent: Vec<String>,
    /// Descriptors a route sends that meet no limit, each naming the route.
    pub(crate) unlimited: Vec<String>,
    /// Actions the check cannot read (their descriptors are left out).
    pub(crate) unread: Vec<String>,
}

/// Where a descriptor comes from, for messages: the virtual host and route.
struct Origin {
    place: String,
    cluster: Option<String>,
    policies: Vec<Value>,
}

/// Cross-checks `rules` with `config`'s rate limit actions (its filter's
/// domain and stage).
pub(crate) fn check(config: &EnvoyConfig, rules: &RuleSet) -> Coverage {
    let mut coverage = Coverage::default();
    let file = config.path.display();
    let mut reached: BTreeSet<usize> = BTreeSet::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for origin in origins(config) {
        for (i, policy) in origin.policies.iter().enumerate() {
            if policy["stage"].as_u64().unwrap_or(0) != config.stage {
                continue;
            }
            let shapes = match shapes(config, policy, origin.cluster.as_deref()) {
                Ok(shapes) => shapes,
                Err(why) => {
                    coverage.unread.push(format!(
                        "{file}: {}, rate_limits[{i}]: {why}; its descriptor is not checked",
                        origin.place
                    ));
                    continue;
                }
            };
            for shape in shapes {
                let borrowed: Vec<(&str, Option<&str>)> = shape
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_deref()))
                    .collect();
                let met: Vec<&Arc<Rule>> = rules
                    .reachable(&config.domain, &borrowed)
                    .into_iter()
                    .filter(|r| r.limit.is_some())
                    .collect();
                reached.extend(met.iter().map(|r| r.index));
                let text = describe(&shape);
                if met.is_empty() && seen.insert(format!("{}{text}", origin.place)) {
                    coverage.unlimited.push(format!(
                        "{file}: {}, rate_limits[{i}] sends {text} in domain '{}', which no rule limits: it is answered OK for nothing",
                        origin.place, config.domain
                    ));
                }
            }
        }
    }
    let sent = sent_keys(config);
    let sent = if sent.is_empty() {
        "none".to_owned()
    } else {
        sent.into_iter().collect::<Vec<_>>().join(", ")
    };
    for rule in rules.rules() {
        if *rule.domain != *config.domain || rule.limit.is_none() || reached.contains(&rule.index) {
            continue;
        }
        coverage.unsent.push(format!(
            "{}:{}: rule {} limits nothing under {file}: no route sends a descriptor it matches (the keys Envoy sends in domain '{}': {})",
            rule.source.file.display(),
            rule.source.line,
            crate::rules::printable(&rule.path),
            config.domain,
            sent
        ));
    }
    coverage
}

/// Every place rate limit actions are written, with the policies a request
/// there gets: the filter's own (which replace the routes'), else each
/// route's (with its virtual host's when it asks for them or has none).
fn origins(config: &EnvoyConfig) -> Vec<Origin> {
    if let Some(policies) = &config.filter_rate_limits {
        return vec![Origin {
            place: "the rate limit filter".into(),
            cluster: None,
            policies: policies.clone(),
        }];
    }
    let mut origins = Vec::new();
    for (v, vhost) in config.virtual_hosts.iter().enumerate() {
        let host = vhost["name"].as_str().map_or_else(
            || format!("virtual_hosts[{v}]"),
            |n| format!("virtual host '{n}'"),
        );
        for (r, route) in vhost["routes"].as_array().into_iter().flatten().enumerate() {
            let own = route["route"]["rate_limits"].as_array();
            let include = route["route"]["include_vh_rate_limits"]
                .as_bool()
                .unwrap_or(false);
            let mut policies: Vec<Value> = own.into_iter().flatten().cloned().collect();
            if include || own.is_none_or(|o| o.is_empty()) {
                policies.extend(
                    vhost["rate_limits"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
            }
            let matched = ["prefix", "path", "path_separated_prefix"]
                .iter()
                .find_map(|m| route["match"][m].as_str().map(|p| format!(" ({m} {p})")))
                .unwrap_or_default();
            origins.push(Origin {
                place: format!("{host}, routes[{r}]{matched}"),
                cluster: route["route"]["cluster"].as_str().map(str::to_owned),
                policies,
            });
        }
    }
    origins
}

/// The descriptors one `rate_limits` entry can send: one, or two for each
/// `skip_if_absent` header (with it and without).
fn shapes(
    config: &EnvoyConfig,
    policy: &Value,
    cluster: Option<&str>,
) -> Result<Vec<Vec<Entry>>, String> {
    let mut shapes: Vec<Vec<Entry>> = vec![Vec::new()];
    for action in policy["actions"].as_array().into_iter().flatten() {
        let Some((kind, a)) = action.as_object().and_then(|o| o.iter().next()) else {
            continue;
        };
        let key = |default: &str| a["descriptor_key"].as_str().unwrap_or(default).to_owned();
        let fixed = || a["descriptor_value"].as_str().map(str::to_owned);
        let (entry, optional): (Entry, bool) = match kind.as_str() {
            "request_headers" => {
                let header = a["header_name"].as_str().unwrap_or("").to_ascii_lowercase();
                (
                    (key(&header), None),
                    a["skip_if_absent"].as_bool().unwrap_or(false),
                )
            }
            "remote_address" => (("remote_address".into(), None), false),
            "masked_remote_address" => (("masked_remote_address".into(), None), false),
            "generic_key" => (
                (key("generic_key"), Some(fixed().unwrap_or_default())),
                false,
            ),
            "header_value_match" => ((key("header_match"), fixed()), false),
            "query_parameter_value_match" => ((key("query_match"), fixed()), false),
            "query_parameters" => (
                (key(a["query_parameter_name"].as_str().unwrap_or("")), None),
                false,
            ),
            "destination_cluster" => (
                ("destination_cluster".into(), cluster.map(str::to_owned)),
                false,
            ),
            "source_cluster" => (
                ("source_cluster".into(), config.local_cluster.clone()),
                false,
            ),
            "metadata" | "dynamic_metadata" => ((key(kind), None), false),
            other => return Err(format!("action '{other}' is not known to the check")),
        };
        let mut next = Vec::with_capacity(shapes.len() * 2);
        for shape in shapes {
            if optional {
                next.push(shape.clone());
            }
            let mut with = shape;
            with.push(entry.clone());
            next.push(with);
        }
        // Bounded: a policy of many optional headers.
        next.truncate(256);
        shapes = next;
    }
    shapes.retain(|s| !s.is_empty());
    Ok(shapes)
}

/// `[key=value, key=*]`.
fn describe(shape: &[Entry]) -> String {
    let entries: Vec<String> = shape
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                crate::rules::printable(k),
                v.as_deref().map_or("*".into(), crate::rules::printable)
            )
        })
        .collect();
    format!("[{}]", entries.join(", "))
}

/// The first keys of every descriptor the configuration can send.
fn sent_keys(config: &EnvoyConfig) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for origin in origins(config) {
        for policy in &origin.policies {
            for shape in shapes(config, policy, origin.cluster.as_deref()).unwrap_or_default() {
                keys.insert(
                    shape
                        .iter()
                        .map(|(k, _)| crate::rules::printable(k).into_owned())
                        .collect::<Vec<_>>()
                        .join("."),
                );
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &tempfile::TempDir, routes: &str) -> EnvoyConfig {
        let yaml = format!(
            r#"static_resources:
  listeners:
    - filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                route_config:
                  virtual_hosts:
                    - name: api
                      domains: ["*"]
                      routes:
{routes}
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: api
"#
        );
        let path = dir.path().join("envoy.yaml");
        std::fs::write(&path, yaml).expect("write");
        EnvoyConfig::load(&path).expect("a configuration")
    }

    #[test]
    fn a_key_envoy_never_sends_and_a_descriptor_no_rule_limits_are_both_found() {
        let dir = tempfile::tempdir().expect("dir");
        let envoy = config(
            &dir,
            r#"                        - match: { prefix: "/login" }
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - generic_key: { descriptor_value: login }
                                  - remote_address: {}
                              - actions:
                                  - request_headers: { header_name: x-api-key, descriptor_key: api_key }
                        - match: { prefix: "/" }
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - request_headers: { header_name: x-plan, descriptor_key: plan, skip_if_absent: true }
                                  - remote_address: {}"#,
        );
        let rules = RuleSet::from_yaml(
            "domain: api
descriptors:
  - key: generic_key
    value: login
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: apikey
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
",
        )
        .expect("rules");
        let found = check(&envoy, &rules);
        assert_eq!(found.unsent.len(), 1, "{found:?}");
        assert!(found.unsent[0].contains("api.apikey"), "{found:?}");
        assert!(
            found.unsent[0].contains("api_key"),
            "the keys Envoy sends: {found:?}"
        );
        // x-api-key as api_key: no rule; the plan header with the address:
        // no rule (the address alone, when the header is absent, is limited).
        assert_eq!(found.unlimited.len(), 2, "{found:?}");
        assert!(found.unlimited[0].contains("[api_key=*]"), "{found:?}");
        assert!(found.unlimited[0].contains("prefix /login"), "{found:?}");
        assert!(
            found.unlimited[1].contains("[plan=*, remote_address=*]"),
            "{found:?}"
        );
        assert!(found.unread.is_empty());
        // What the author meant: nothing to say.
        let meant = RuleSet::from_yaml(
            "domain: api
descriptors:
  - key: generic_key
    value: login
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: plan
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 20}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
",
        )
        .expect("rules");
        let found = check(&envoy, &meant);
        assert!(
            found.unsent.is_empty() && found.unlimited.is_empty(),
            "{found:?}"
        );
    }

    #[test]
    fn a_fixed_value_meets_only_its_rule_and_an_unknown_action_is_said() {
        let dir = tempfile::tempdir().expect("dir");
        let envoy = config(
            &dir,
            r#"                        - match: { prefix: "/" }
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - generic_key: { descriptor_value: checkout }
                              - actions:
                                  - extension: { name: custom }"#,
        );
        let rules = RuleSet::from_yaml(
            "domain: api
descriptors:
  - key: generic_key
    value: login
    rate_limit: {unit: minute, requests_per_unit: 5}
",
        )
        .expect("rules");
        let found = check(&envoy, &rules);
        assert_eq!(found.unsent.len(), 1, "login is never sent: {found:?}");
        assert!(
            found.unlimited[0].contains("[generic_key=checkout]"),
            "{found:?}"
        );
        assert!(found.unread[0].contains("'extension'"), "{found:?}");
    }
}
