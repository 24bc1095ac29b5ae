//! Which route a logged request takes: virtual hosts by domain, routes by
//! path and headers, as Envoy matches them.

use serde_json::Value;

use super::access_log::{Field, Logged};
use super::config::EnvoyConfig;

/// Whether a virtual host's `domains` pattern matches `host` (port removed).
pub(super) fn domain_matches(pattern: &str, host: &str) -> bool {
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
pub(super) fn string_matches(config: &EnvoyConfig, matcher: &Value, value: &str) -> Option<bool> {
    if let Some(re) = matcher["safe_regex"]["regex"].as_str() {
        return config.regexes.get(re).map(|re| re.is_match(value));
    }
    let fold = matcher["ignore_case"].as_bool().unwrap_or(false);
    pub(super) fn lower(s: &str, fold: bool) -> std::borrow::Cow<'_, str> {
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

/// Envoy's HeaderMatcher against a logged request; `Err` names what the log
/// lacks or what is not supported.
pub(super) fn header_matches(
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
pub(super) fn route<'a>(
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
