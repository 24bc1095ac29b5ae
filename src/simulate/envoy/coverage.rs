//! `tollgate check RULES --envoy-config envoy.yaml`: the rules and Envoy's
//! rate limit actions, each side checked against the other. Every rate
//! limit filter of the configuration (each listener's, each stage's) is
//! read with its routes; each descriptor a route can send is worked out from
//! its actions (a header's or an address's value is unknown: any value; a
//! `skip_if_absent` entry may be missing), then walked through the rule tree
//! as the matcher walks it. A rule with a limit that no filter's routes can
//! reach limits nothing (a key Envoy never sends: `apikey` for `api_key`;
//! a domain no filter sends); a descriptor no rule names is sent for
//! nothing. Routes that answer themselves (`direct_response`, `redirect`)
//! never call the rate limit service and are left out.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::config::{EnvoyConfig, uint};
use crate::rules::{RuleSet, ShapeEntry, printable};

/// One entry of a descriptor a route sends: its key, its value when the
/// configuration fixes it, and whether it may be absent.
#[derive(Debug, Clone)]
struct Entry {
    key: String,
    value: Option<String>,
    optional: bool,
}

/// The most forms of one policy spelt out for the "no rule" warnings (its
/// optional entries present or not): past it, only whether the rules can
/// be reached is checked, and that is said.
const MAX_FORMS: usize = 64;

/// The forms of one policy that meet no rule shown one by one; the rest
/// are counted.
const SHOWN_FORMS: usize = 3;

/// What the cross-check found.
#[derive(Debug, Default)]
pub(crate) struct Coverage {
    /// Rules with a limit no route of the configuration can reach, each
    /// `file:line: ...`.
    pub(crate) unsent: Vec<String>,
    /// Descriptors a route sends that no rule names, each naming the route.
    pub(crate) unlimited: Vec<String>,
    /// What the check cannot read (those descriptors are left out).
    pub(crate) unread: Vec<String>,
}

/// A place rate limit actions are written, and the routes that use them.
struct Origin<'a> {
    /// `virtual host 'api', routes[2] (prefix /login)`, or the virtual
    /// host's or the filter's own list.
    place: String,
    /// Routes whose requests get these policies (one, or every route of a
    /// virtual host that takes its list).
    routes: usize,
    cluster: Option<&'a str>,
    policies: &'a [Value],
}

/// Cross-checks `rules` with the rate limit actions of `filters` (every
/// rate limit filter of one Envoy configuration).
pub(crate) fn check(filters: &[EnvoyConfig], rules: &RuleSet) -> Coverage {
    let mut coverage = Coverage::default();
    let mut reached: BTreeSet<usize> = BTreeSet::new();
    // Per domain, the keys of the descriptors sent (`a.b`), for messages.
    let mut sent: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for config in filters {
        let file = config.path.display();
        let domain = printable(&config.domain).into_owned();
        let keys = sent.entry(config.domain.clone()).or_default();
        for origin in origins(config) {
            for (i, policy) in origin.policies.iter().enumerate() {
                if uint(&policy["stage"]).unwrap_or(0) != config.stage {
                    continue;
                }
                let shape = match shape(config, policy, origin.cluster) {
                    Ok(shape) => shape,
                    Err(why) => {
                        coverage.unread.push(format!(
                            "{file}: {}, rate_limits[{i}]: {why}; its descriptor is not checked",
                            origin.place
                        ));
                        continue;
                    }
                };
                if shape.is_empty() {
                    continue;
                }
                let entries: Vec<ShapeEntry<'_>> = shape
                    .iter()
                    .map(|e| ShapeEntry {
                        key: &e.key,
                        value: e.value.as_deref(),
                        optional: e.optional,
                    })
                    .collect();
                reached.extend(
                    rules
                        .reachable(&config.domain, &entries)
                        .iter()
                        .map(|r| r.index),
                );
                let forms = forms(&shape);
                if forms.len() > MAX_FORMS {
                    let optional = shape.iter().filter(|e| e.optional).count();
                    coverage.unread.push(format!(
                        "{file}: {}, rate_limits[{i}]: {optional} optional entries make 2^{optional} forms of its descriptor; the first {MAX_FORMS} are checked for a rule that names them (every rule it can reach is found)",
                        origin.place,
                    ));
                }
                let mut unnamed = 0usize;
                for form in forms.iter().take(MAX_FORMS) {
                    keys.insert(
                        form.iter()
                            .map(|e| printable(&e.key))
                            .collect::<Vec<_>>()
                            .join("."),
                    );
                    let exact: Vec<ShapeEntry<'_>> = form
                        .iter()
                        .map(|e| ShapeEntry {
                            key: &e.key,
                            value: e.value.as_deref(),
                            optional: false,
                        })
                        .collect();
                    // A rule that is `unlimited` names the descriptor too.
                    if rules.reachable(&config.domain, &exact).is_empty() {
                        unnamed += 1;
                        if unnamed > SHOWN_FORMS {
                            continue;
                        }
                        let routes = match origin.routes {
                            1 => String::new(),
                            n => format!(" (used by {n} routes)"),
                        };
                        coverage.unlimited.push(format!(
                            "{file}: {}, rate_limits[{i}]{routes} sends {} in domain '{domain}', which no rule names: it is answered OK for nothing",
                            origin.place,
                            describe(form)
                        ));
                    }
                }
                if unnamed > SHOWN_FORMS {
                    coverage.unlimited.push(format!(
                        "{file}: {}, rate_limits[{i}]: {} more forms of its descriptor (its optional entries present or not) meet no rule either",
                        origin.place,
                        unnamed - SHOWN_FORMS
                    ));
                }
            }
        }
    }
    let file = filters
        .first()
        .map(|f| f.path.display().to_string())
        .unwrap_or_default();
    for rule in rules.rules() {
        if rule.limit.is_none() || reached.contains(&rule.index) {
            continue;
        }
        let why = match sent.get(&*rule.domain) {
            None => format!(
                "no rate limit filter of {file} sends domain '{}' (they send: {})",
                printable(&rule.domain),
                sent.keys()
                    .map(|d| format!("'{}'", printable(d)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some(keys) => format!(
                "no route sends a descriptor it matches (the descriptors Envoy sends in domain '{}': {})",
                printable(&rule.domain),
                if keys.is_empty() {
                    "none".to_owned()
                } else {
                    keys.iter().cloned().collect::<Vec<_>>().join(", ")
                }
            ),
        };
        coverage.unsent.push(format!(
            "{}:{}: rule {} limits nothing under {file}: {why}",
            rule.source.file.display(),
            rule.source.line,
            printable(&rule.path),
        ));
    }
    coverage
}

/// Every place rate limit actions are written for one filter: the filter's
/// own (which replace the routes'), else each route's own list, and each
/// virtual host's list once with the number of routes that take it (a
/// route without a list of its own, or with `include_vh_rate_limits`).
/// Routes that answer themselves never call the service.
fn origins(config: &EnvoyConfig) -> Vec<Origin<'_>> {
    if let Some(policies) = &config.filter_rate_limits {
        return vec![Origin {
            place: "the rate limit filter".into(),
            routes: 1,
            cluster: None,
            policies,
        }];
    }
    let mut origins = Vec::new();
    for (v, vhost) in config.virtual_hosts.iter().enumerate() {
        let host = vhost["name"].as_str().map_or_else(
            || format!("virtual_hosts[{v}]"),
            |n| format!("virtual host '{}'", printable(n)),
        );
        let mut taking = 0;
        for (r, route) in vhost["routes"].as_array().into_iter().flatten().enumerate() {
            let Some(action) = route.get("route") else {
                continue;
            };
            let own = action["rate_limits"].as_array().filter(|o| !o.is_empty());
            if own.is_none() || action["include_vh_rate_limits"].as_bool().unwrap_or(false) {
                taking += 1;
            }
            let Some(own) = own else { continue };
            let matched = ["prefix", "path", "path_separated_prefix"]
                .iter()
                .find_map(|m| {
                    route["match"][m]
                        .as_str()
                        .map(|p| format!(" ({m} {})", printable(p)))
                })
                .unwrap_or_default();
            origins.push(Origin {
                place: format!("{host}, routes[{r}]{matched}"),
                routes: 1,
                cluster: action["cluster"].as_str(),
                policies: own,
            });
        }
        if let Some(policies) = vhost["rate_limits"].as_array()
            && taking > 0
        {
            origins.push(Origin {
                place: format!("{host}'s own rate_limits"),
                routes: taking,
                cluster: None,
                policies,
            });
        }
    }
    origins
}

/// The descriptor one `rate_limits` entry sends: its entries in order.
fn shape(
    config: &EnvoyConfig,
    policy: &Value,
    cluster: Option<&str>,
) -> Result<Vec<Entry>, String> {
    let mut shape = Vec::new();
    let Some(actions) = policy["actions"].as_array() else {
        return Err("its actions are not a list".into());
    };
    for action in actions {
        let Some(object) = action.as_object().filter(|o| o.len() == 1) else {
            return Err(format!(
                "an action that is not an object of one kind ({})",
                printable(&action.to_string())
            ));
        };
        let Some((kind, a)) = object.iter().next() else {
            continue;
        };
        let text = |field: &str| a[field].as_str().map(str::to_owned);
        let key = |default: &str| text("descriptor_key").unwrap_or_else(|| default.to_owned());
        let optional = a["skip_if_absent"].as_bool().unwrap_or(false);
        let (key, value) = match kind.as_str() {
            "request_headers" => {
                let header = text("header_name")
                    .ok_or("request_headers without a header_name (a string)")?
                    .to_ascii_lowercase();
                (key(&header), None)
            }
            "remote_address" => ("remote_address".into(), None),
            "masked_remote_address" => ("masked_remote_address".into(), None),
            "generic_key" => (
                key("generic_key"),
                Some(
                    text("descriptor_value")
                        .ok_or("generic_key without a descriptor_value (a string)")?,
                ),
            ),
            "header_value_match" => (
                key("header_match"),
                Some(
                    text("descriptor_value")
                        .ok_or("header_value_match without a descriptor_value (a string)")?,
                ),
            ),
            "query_parameter_value_match" => {
                (
                    key("query_match"),
                    Some(text("descriptor_value").ok_or(
                        "query_parameter_value_match without a descriptor_value (a string)",
                    )?),
                )
            }
            "query_parameters" => (key(&text("query_parameter_name").unwrap_or_default()), None),
            "destination_cluster" => ("destination_cluster".into(), cluster.map(str::to_owned)),
            "source_cluster" => ("source_cluster".into(), config.local_cluster.clone()),
            "metadata" | "dynamic_metadata" => (key(kind), None),
            // An extension (CEL, ...) names its key; its value is its own.
            other => match text("descriptor_key") {
                Some(key) => (key, None),
                None => {
                    return Err(format!(
                        "action '{}' is not known to the check and names no descriptor_key",
                        printable(other)
                    ));
                }
            },
        };
        shape.push(Entry {
            key,
            value,
            optional,
        });
    }
    Ok(shape)
}

/// Every form of `shape` (each optional entry present or absent), the full
/// one first; at most [`MAX_FORMS`] + 1 are made.
fn forms(shape: &[Entry]) -> Vec<Vec<&Entry>> {
    let mut forms: Vec<Vec<&Entry>> = vec![Vec::new()];
    for entry in shape {
        let mut next = Vec::with_capacity(forms.len() * 2);
        for form in forms {
            let mut with = form.clone();
            with.push(entry);
            next.push(with);
            if entry.optional {
                next.push(form);
            }
        }
        next.truncate(MAX_FORMS + 1);
        forms = next;
    }
    forms.retain(|f| !f.is_empty());
    forms
}

/// `[key=value, key=*]`.
fn describe(form: &[&Entry]) -> String {
    let entries: Vec<String> = form
        .iter()
        .map(|e| {
            format!(
                "{}={}",
                printable(&e.key),
                e.value.as_deref().map_or("*".into(), printable)
            )
        })
        .collect();
    format!("[{}]", entries.join(", "))
}

#[cfg(test)]
#[path = "coverage_tests.rs"]
mod tests;
