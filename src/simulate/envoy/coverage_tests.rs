//! `check --envoy-config`'s cross-check, on small Envoy configurations.

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
    let found = check(std::slice::from_ref(&envoy), &rules);
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
    let found = check(std::slice::from_ref(&envoy), &meant);
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
    let found = check(std::slice::from_ref(&envoy), &rules);
    assert_eq!(found.unsent.len(), 1, "login is never sent: {found:?}");
    assert!(
        found.unlimited[0].contains("[generic_key=checkout]"),
        "{found:?}"
    );
    assert!(found.unread[0].contains("'extension'"), "{found:?}");
}

#[test]
fn what_envoy_never_sends_is_found_and_what_it_may_send_is_not_refused() {
    let dir = tempfile::tempdir().expect("dir");
    // Ten optional headers (1,024 forms), a route that answers itself,
    // metadata that may be absent, and routes without a list of their
    // own in a virtual host without one.
    let headers: String = (1..=10)
            .map(|i| format!("                                  - request_headers: {{ header_name: h{i}, descriptor_key: h{i}, skip_if_absent: true }}\n"))
            .collect();
    let envoy = config(
        &dir,
        &format!(
            r#"                        - match: {{ prefix: "/old" }}
                          redirect: {{ path_redirect: "/new" }}
                        - match: {{ prefix: "/many" }}
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
{headers}                        - match: {{ prefix: "/meta" }}
                          route:
                            cluster: app
                            rate_limits:
                              - actions:
                                  - metadata: {{ descriptor_key: tier, skip_if_absent: true, metadata_key: {{ key: k, path: [{{ key: t }}] }} }}
                                  - remote_address: {{}}
                        - match: {{ prefix: "/a" }}
                          route: {{ cluster: app }}"#
        ),
    );
    let rules = RuleSet::from_yaml(
        "domain: api
descriptors:
  - key: h1
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: h10
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: h3
    descriptors:
      - key: h7
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /old
    rate_limit: {unit: minute, requests_per_unit: 5}
",
    )
    .expect("rules");
    let found = check(std::slice::from_ref(&envoy), &rules);
    // Every form of the ten headers reaches its rule; the redirect
    // route sends nothing, so its rule limits nothing.
    assert_eq!(found.unsent.len(), 1, "{found:?}");
    assert!(found.unsent[0].contains("api.path_/old"), "{found:?}");
    assert!(
        found.unread.iter().any(|u| u.contains("2^10 forms")),
        "{found:?}"
    );
    // The metadata form [tier, remote_address] meets no rule; without
    // the tier it does.
    assert!(
        found
            .unlimited
            .iter()
            .any(|u| u.contains("sends [tier=*, remote_address=*] ")),
        "{found:?}"
    );
    assert!(
        !found
            .unlimited
            .iter()
            .any(|u| u.contains("sends [remote_address=*] ")),
        "{found:?}"
    );
    // Of the headers' forms that meet no rule, three are shown and the
    // rest counted.
    let many: Vec<&String> = found
        .unlimited
        .iter()
        .filter(|u| u.contains("prefix /many"))
        .collect();
    assert_eq!(many.len(), 4, "{many:#?}");
    assert!(many[3].contains("more forms"), "{many:#?}");
    // A descriptor that meets an `unlimited` rule is named by it: no
    // warning; a domain no filter sends is an error.
    let rules = RuleSet::from_yaml(
        "domain: api
descriptors:
  - key: tier
    descriptors:
      - key: remote_address
        rate_limit: {unlimited: true}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 5}
",
    )
    .expect("rules");
    let found = check(std::slice::from_ref(&envoy), &rules);
    assert!(
        !found
            .unlimited
            .iter()
            .any(|u| u.contains("[tier=*, remote_address=*]")),
        "{found:?}"
    );
    let other = RuleSet::from_yaml(
        "domain: apii
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 5}
",
    )
    .expect("rules");
    let found = check(std::slice::from_ref(&envoy), &other);
    assert!(
        found.unsent[0].contains("no rate limit filter") && found.unsent[0].contains("'apii'"),
        "{found:?}"
    );
}
