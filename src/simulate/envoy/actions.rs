//! Rate limit actions to descriptors, from what a log line recorded.

use serde_json::Value;

use super::access_log::{Field, Logged};
use super::config::EnvoyConfig;
use super::routing::header_matches;
use crate::simulate::traffic::{Entries, Strings};

/// A client address masked to `bits` (IPv4) or `bits6` (IPv6): `10.1.2.0/24`.
pub(super) fn masked(address: &str, bits: u32, bits6: u32) -> Option<String> {
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
pub(super) fn client_address(logged: &Logged) -> Option<String> {
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
pub(super) fn descriptor(
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
