//! Istio as shipped, through a real Envoy: the rate limit filter names the
//! cluster Istio generates (`outbound|PORT||HOST`) and, unless the
//! EnvoyFilter sets one, no authority, so Envoy sends the cluster name as
//! `:authority`. And the EnvoyFilter and ConfigMap in examples/kubernetes,
//! read from the files themselves, enforce their limits.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;

use crate::common::Tollgate;
use crate::common::envoy::{Envoy, http};
use crate::common::redis::free_port;
use serde_json::{Value, json};

const ISTIO_CLUSTER: &str = "outbound|8081||tollgate.tollgate.svc.cluster.local";

fn documents(file: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/kubernetes")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("manifest");
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// The patch values of `file`'s EnvoyFilters that apply to `apply_to`.
fn patches(file: &str, apply_to: &str) -> Vec<Value> {
    documents(file)
        .into_iter()
        .filter(|d| d["kind"] == "EnvoyFilter")
        .flat_map(|d| {
            d["spec"]["configPatches"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|p| p["applyTo"] == apply_to)
        .map(|p| p["patch"]["value"].clone())
        .collect()
}

/// An Envoy bootstrap like the one Istio builds for an ingress gateway:
/// `filter` (a rate limit HTTP filter) before the router, `rate_limits` on
/// the virtual host, an upstream answering 200, and Tollgate as the cluster
/// `ISTIO_CLUSTER`.
fn istio_like_gateway(
    filter: Value,
    rate_limits: Value,
    tollgate: SocketAddr,
) -> (Envoy, SocketAddr) {
    let (listen, upstream, admin) = (free_port(), free_port(), free_port());
    let socket =
        |port: u16| json!({"socket_address": {"address": "127.0.0.1", "port_value": port}});
    let hcm = |name: &str, route_config: Value, filters: Vec<Value>| {
        json!({
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                "use_remote_address": true,
                "route_config": route_config,
                "http_filters": filters,
            }
        })
    };
    let router = json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    });
    let config = json!({
        "admin": {"address": socket(admin)},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": socket(listen),
                    "filter_chains": [{"filters": [hcm("gateway", json!({
                        "virtual_hosts": [{
                            "name": "api",
                            "domains": ["*"],
                            "rate_limits": rate_limits,
                            "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}],
                        }]
                    }), vec![filter, router.clone()])]}],
                },
                {
                    "name": "upstream",
                    "address": socket(upstream),
                    "filter_chains": [{"filters": [hcm("upstream", json!({
                        "virtual_hosts": [{
                            "name": "ok",
                            "domains": ["*"],
                            "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}],
                        }]
                    }), vec![router])]}],
                },
            ],
            "clusters": [
                {
                    "name": "upstream",
                    "type": "STATIC",
                    "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket(upstream)}}]}]},
                },
                {
                    "name": ISTIO_CLUSTER,
                    "type": "STATIC",
                    "connect_timeout": "0.25s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    "load_assignment": {"cluster_name": ISTIO_CLUSTER, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket(tollgate.port())}}]}]},
                },
            ],
        },
    });
    let envoy = Envoy::start_text("istio.json", &config.to_string(), admin);
    (envoy, SocketAddr::from(([127, 0, 0, 1], listen)))
}

fn status(addr: SocketAddr, headers: &[(&str, &str)]) -> u16 {
    status_of(addr, "/items", headers)
}

fn status_of(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> u16 {
    http(addr, "GET", path, headers)
        .expect("gateway answers")
        .status
}

#[test]
fn the_istio_cluster_name_without_an_authority_is_limited() {
    let tollgate = Tollgate::start(
        "domain: gateway\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
        &[],
    );
    // As Istio's rate limit task wrote it before it added `authority`.
    let filter = json!({
        "name": "envoy.filters.http.ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": "gateway",
            "failure_mode_deny": false,
            "timeout": "1s",
            "rate_limit_service": {
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": ISTIO_CLUSTER}},
            },
        }
    });
    let rate_limits = json!([{"actions": [{"remote_address": {}}]}]);
    let (envoy, addr) = istio_like_gateway(filter, rate_limits, tollgate.addr);
    let statuses: Vec<u16> = (0..4).map(|_| status(addr, &[])).collect();
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert_eq!(envoy.stat("cluster.upstream.ratelimit.error"), 0);
    assert_eq!(envoy.stat("cluster.upstream.ratelimit.over_limit"), 2);
}

/// Tollgate on the rules exactly as the ConfigMap ships them, behind an
/// Envoy with the filter and the route actions exactly as the EnvoyFilters
/// ship them.
fn shipped_gateway() -> (Value, tempfile::TempDir, Tollgate, Envoy, SocketAddr) {
    // The rules exactly as the ConfigMap ships them.
    let configmap = documents("base/rules.yaml")
        .into_iter()
        .find(|d| d["kind"] == "ConfigMap")
        .expect("a ConfigMap in base/rules.yaml");
    let rules_dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in configmap["data"].as_object().expect("data") {
        std::fs::write(rules_dir.path().join(name), text.as_str().expect("text")).expect("write");
    }
    let rules = rules_dir.path().to_str().expect("utf-8");
    let tollgate = Tollgate::start("", &["--rules", rules]);

    // The filter and the route actions exactly as the EnvoyFilters ship them.
    let filters = patches("istio-envoyfilter.yaml", "HTTP_FILTER");
    let [filter] = filters.as_slice() else {
        panic!("one HTTP_FILTER patch: {filters:?}");
    };
    let grpc = &filter["typed_config"]["rate_limit_service"]["grpc_service"]["envoy_grpc"];
    assert_eq!(grpc["cluster_name"], ISTIO_CLUSTER);
    assert_eq!(grpc["authority"], "tollgate.tollgate.svc.cluster.local");
    let hosts = patches("istio-envoyfilter.yaml", "VIRTUAL_HOST");
    let [host] = hosts.as_slice() else {
        panic!("one VIRTUAL_HOST patch: {hosts:?}");
    };
    let (envoy, addr) =
        istio_like_gateway(filter.clone(), host["rate_limits"].clone(), tollgate.addr);

    (configmap, rules_dir, tollgate, envoy, addr)
}

#[test]
fn the_shipped_envoyfilter_and_configmap_enforce_their_limits() {
    let (configmap, _rules, _tollgate, envoy, addr) = shipped_gateway();
    // The ConfigMap's anonymous limit: 240 a minute per client address.
    let anonymous = configmap["data"]["gateway.yaml"]
        .as_str()
        .and_then(|t| t.split("requests_per_unit: ").nth(1))
        .and_then(|t| t.split('}').next())
        .and_then(|n| n.trim().parse::<usize>().ok())
        .expect("the anonymous limit is the ConfigMap's first");
    let within = (0..anonymous).filter(|_| status(addr, &[]) == 200).count();
    assert_eq!(within, anonymous);
    // The sliding window (the default) lets the previous minute's hits decay
    // when the run straddles a minute: at 240 a minute, by 4 a second, so at
    // most one or two of these could pass within a second of the boundary.
    let refused = (0..10).filter(|_| status(addr, &[]) == 429).count();
    assert!(refused >= 8, "{refused} of 10 refused past the limit");
    // Signed-in users have their own limit: still admitted.
    assert_eq!(status(addr, &[("x-user-id", "ann")]), 200);
    assert_eq!(envoy.stat("cluster.upstream.ratelimit.error"), 0);
    assert_eq!(
        envoy.stat("cluster.upstream.ratelimit.over_limit"),
        refused as u64
    );
}

/// Every limit of the shipped ConfigMap is reached by some request through
/// the shipped EnvoyFilters: none is a limit that never fires.
#[test]
fn the_shipped_envoyfilter_produces_every_descriptor_the_configmap_limits() {
    let (_configmap, rules, tollgate, envoy, addr) = shipped_gateway();
    // /login: ten a minute per client address, then refused (the anonymous
    // limit, 240, is far away). A run that crosses a minute boundary may see
    // one more admitted (the sliding window weighs the previous minute's).
    let logins: Vec<u16> = (0..13).map(|_| status_of(addr, "/login", &[])).collect();
    assert_eq!(logins[..10], [200; 10], "{logins:?}");
    assert!(
        logins[10..].iter().filter(|s| **s == 429).count() >= 2,
        "the /login limit refuses: {logins:?}"
    );
    assert_eq!(status(addr, &[("x-user-id", "ann")]), 200);
    assert_eq!(status(addr, &[("x-org-id", "acme")]), 200);
    assert_eq!(envoy.stat("cluster.upstream.ratelimit.error"), 0);

    // The ConfigMap's limits, as `tollgate check` lists them
    // (`gateway.path_/login.remote_address: ...`), each counted.
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg(rules.path())
        .output()
        .expect("check");
    let listed = String::from_utf8_lossy(&check.stdout).into_owned();
    let mut limits = 0;
    for line in listed.lines().filter(|l| l.contains(" per ")) {
        let path = line.split(':').next().expect("a rule path");
        let (domain, keys) = path.split_once('.').expect("domain.keys");
        let labels: Vec<String> = keys
            .split('.')
            .enumerate()
            .map(|(i, k)| format!("key{}=\"{k}\"", i + 1))
            .collect();
        let metric = format!(
            "ratelimit_service_rate_limit_total_hits{{domain=\"{domain}\",{}}}",
            labels.join(",")
        );
        assert!(
            tollgate.metric(&metric) > 0,
            "{path} was never asked for: {metric}"
        );
        limits += 1;
    }
    assert!(limits >= 4, "the ConfigMap's limits: {listed}");
}
