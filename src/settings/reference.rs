//! The reference service's environment variables, so an existing
//! envoyproxy/ratelimit Deployment can switch its image, and the check that
//! refuses unknown `TOLLGATE_*` variables.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::{LogFormat, OnOff, ServeArgs, StoreKind};

impl ServeArgs {
    /// Applies the reference service's environment variables (so an existing
    /// Deployment can switch its image), and refuses unknown `TOLLGATE_*`
    /// variables and contradictions. `explicit(name)` tells whether a flag
    /// was set on the command line or by its `TOLLGATE_*` variable.
    pub fn apply_reference_env(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        explicit: &dyn Fn(&str) -> bool,
    ) -> Result<(), String> {
        let truthy = |name: &str| -> Result<Option<bool>, String> {
            match env(name).as_deref().map(str::to_ascii_lowercase).as_deref() {
                None | Some("") => Ok(None),
                Some("true" | "1" | "yes") => Ok(Some(true)),
                Some("false" | "0" | "no") => Ok(Some(false)),
                Some(other) => Err(format!("{name}={other}: expected true or false")),
            }
        };
        let conflict = |ours: &str, theirs: &str| {
            format!(
                "{theirs} (envoyproxy/ratelimit's setting) contradicts --{ours}; set one of them"
            )
        };

        if let Some(addr) = listen_addr(env, "GRPC_HOST", "GRPC_PORT")? {
            if explicit("grpc_addr") && self.grpc_addr != addr {
                return Err(conflict("grpc-addr", "GRPC_PORT"));
            }
            self.grpc_addr = addr;
        }
        let mut admin = Vec::new();
        for name in ["PORT", "DEBUG_PORT"] {
            if let Some(addr) = listen_addr(env, "HOST", name)?
                && !admin.contains(&addr)
            {
                admin.push(addr);
            }
        }
        if !admin.is_empty() {
            if explicit("admin_addr") {
                return Err(conflict("admin-addr", "PORT/DEBUG_PORT"));
            }
            self.admin_addr = admin;
        }
        if let Some(level) = env("LOG_LEVEL").filter(|_| !explicit("log_level")) {
            self.log_level = level.to_ascii_lowercase();
        }
        if let Some(format) = env("LOG_FORMAT") {
            self.log_format = match format.to_ascii_lowercase().as_str() {
                "json" => LogFormat::Json,
                "text" => LogFormat::Text,
                other => return Err(format!("LOG_FORMAT={other}: expected text or json")),
            };
        }
        match env("BACKEND_TYPE")
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("" | "redis") => {}
            Some(other) => {
                return Err(format!(
                    "BACKEND_TYPE={other}: Tollgate supports redis (and its own memory store)"
                ));
            }
        }
        let redis_type = match env("REDIS_TYPE")
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("") => None,
            Some("single") => Some(StoreKind::Redis),
            Some("cluster") => Some(StoreKind::RedisCluster),
            Some(other) => {
                return Err(format!(
                    "REDIS_TYPE={other}: Tollgate supports single and cluster"
                ));
            }
        };
        if let Some(url) = env("REDIS_URL") {
            if explicit("redis_url") {
                return Err(conflict("redis-url", "REDIS_URL"));
            }
            // The reference takes host:port (comma-separated for a cluster).
            let tls = truthy("REDIS_TLS")?.unwrap_or(false);
            let auth = env("REDIS_AUTH").filter(|a| !a.is_empty());
            let scheme = if tls { "rediss" } else { "redis" };
            self.redis_url = url
                .split(',')
                .map(|node| {
                    let node = node.trim();
                    let bare = node.split_once("://").map_or(node, |(_, rest)| rest);
                    match &auth {
                        Some(a) => format!("{scheme}://:{a}@{bare}"),
                        None => format!("{scheme}://{bare}"),
                    }
                })
                .collect::<Vec<_>>()
                .join(",");
            let wanted = redis_type.unwrap_or(StoreKind::Redis);
            if explicit("store") && self.store != wanted {
                return Err(conflict("store", "REDIS_URL/REDIS_TYPE"));
            }
            self.store = wanted;
        } else if redis_type.is_some() {
            return Err("REDIS_TYPE is set without REDIS_URL".into());
        }
        // REDIS_POOL_SIZE is accepted and not needed: connections are
        // multiplexed, one per worker thread.
        if let Some(size) = env("REDIS_POOL_SIZE") {
            size.parse::<u32>()
                .map_err(|_| format!("REDIS_POOL_SIZE={size}: not a number"))?;
        }
        if let Some(on) = truthy("LIMIT_RESPONSE_HEADERS_ENABLED")? {
            self.response_headers = if on { OnOff::On } else { OnOff::Off };
        }
        if let Some(on) = truthy("SHADOW_MODE")? {
            self.shadow_mode |= on;
        }
        if let Some(ratio) = env("NEAR_LIMIT_RATIO") {
            self.near_limit_ratio = ratio
                .parse()
                .map_err(|_| format!("NEAR_LIMIT_RATIO={ratio}: not a number"))?;
        }
        if let Some(bytes) = env("LOCAL_CACHE_SIZE_IN_BYTES") {
            let bytes: u64 = bytes
                .parse()
                .map_err(|_| format!("LOCAL_CACHE_SIZE_IN_BYTES={bytes}: not a number"))?;
            if bytes > 0 {
                self.over_limit_cache = OnOff::On;
            }
        }
        if let Some(root) = env("RUNTIME_ROOT") {
            if explicit("rules") {
                return Err(conflict("rules", "RUNTIME_ROOT"));
            }
            let sub = env("RUNTIME_SUBDIRECTORY").unwrap_or_default();
            self.rules = vec![PathBuf::from(root).join(sub).join("config")];
        }
        if truthy("RUNTIME_WATCH_ROOT")? == Some(false)
            || truthy("RUNTIME_IGNOREDOTFILES")? == Some(false)
        {
            // Accepted: Tollgate always skips dot files and watches the rules path.
        }
        if truthy("USE_STATSD")? == Some(true) {
            return Err("USE_STATSD=true: Tollgate exports Prometheus metrics on /metrics instead of statsd".into());
        }
        if !(0.0..=1.0).contains(&self.near_limit_ratio) {
            return Err(format!(
                "near limit ratio {} must be between 0 and 1",
                self.near_limit_ratio
            ));
        }
        Ok(())
    }
}

/// The address from the reference's `HOST`/`PORT`-style pair, when the port
/// variable is set (the host defaults to all interfaces, as in the reference).
fn listen_addr(
    env: &dyn Fn(&str) -> Option<String>,
    host_var: &str,
    port_var: &str,
) -> Result<Option<SocketAddr>, String> {
    let Some(port) = env(port_var) else {
        return Ok(None);
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{port_var}={port}: not a port"))?;
    let host = env(host_var).unwrap_or_else(|| "0.0.0.0".into());
    let addr = format!("{host}:{port}")
        .parse()
        .map_err(|_| format!("{host_var}={host}: not an IP address"))?;
    Ok(Some(addr))
}

/// The `TOLLGATE_*` variables among `names` that Tollgate does not read:
/// a typo must not silently leave a setting at its default, so any stops
/// start-up. The known names come from the command line's definition (each
/// flag's `env`), so the list cannot drift from the flags. Variables the
/// kubelet injects for a Service whose name starts with `tollgate` (such as
/// `TOLLGATE_SERVICE_HOST` or `TOLLGATE_PORT_8081_TCP`) are not typos.
pub fn unknown_env<'a>(names: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    let command = <super::Cli as clap::CommandFactory>::command();
    let mut known: Vec<String> = command
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .filter_map(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .collect();
    // The tests' pointer to an Envoy binary.
    known.push("TOLLGATE_ENVOY".into());
    names
        .into_iter()
        .filter(|(name, value)| {
            name.starts_with("TOLLGATE_")
                && !known.iter().any(|k| k == name)
                && !injected_by_kubernetes(name, value)
        })
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// Whether `name=value` has the shape of a Kubernetes Service variable:
/// `<SVC>_SERVICE_HOST`, `<SVC>_SERVICE_PORT[_<PORT NAME>]`,
/// `<SVC>_PORT=tcp://…`, `<SVC>_PORT_<n>_<PROTO>[_PROTO|_PORT|_ADDR]`.
fn injected_by_kubernetes(name: &str, value: &str) -> bool {
    if name.ends_with("_SERVICE_HOST") || name.contains("_SERVICE_PORT") {
        return true;
    }
    let url_like = ["tcp://", "udp://", "sctp://"]
        .iter()
        .any(|scheme| value.starts_with(scheme));
    if name.ends_with("_PORT") && url_like {
        return true;
    }
    // ..._PORT_<digits>_<TCP|UDP|SCTP>[_SUFFIX]
    let parts: Vec<&str> = name.split('_').collect();
    parts.windows(3).any(|w| {
        w[0] == "PORT"
            && !w[1].is_empty()
            && w[1].bytes().all(|b| b.is_ascii_digit())
            && matches!(w[2], "TCP" | "UDP" | "SCTP")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_variable_is_known_and_typos_are_not() {
        let unknown = unknown_env([
            ("TOLLGATE_RULES", "x"),
            ("TOLLGATE_MAX_DESCRIPTORS", "8"),
            ("TOLLGATE_REDIS_URLL", "x"),
            ("TOLLGATE_SERVICE_HOST", "10.0.0.1"),
            ("TOLLGATE_PORT_8081_TCP_ADDR", "10.0.0.1"),
            ("TOLLGATE_PORT", "tcp://10.0.0.1:8081"),
            ("TOLLGATE_TIMEOUT", "5s"),
        ]);
        assert_eq!(unknown, ["TOLLGATE_REDIS_URLL", "TOLLGATE_TIMEOUT"]);
    }
}
