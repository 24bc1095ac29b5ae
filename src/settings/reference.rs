//! The reference service's environment variables, so an existing
//! envoyproxy/ratelimit Deployment can switch its image, and the check that
//! refuses unknown `TOLLGATE_*` variables.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::{LogFormat, OnOff, ServeArgs, StoreKind};
use crate::store::redis::redact;

/// Takes a reference variable's value for one of our settings: a value that
/// contradicts an explicitly set flag stops start-up naming both; otherwise
/// the variable wins over the default.
fn adopt<T: PartialEq>(
    field: &mut T,
    value: T,
    explicit: bool,
    flag: &str,
    var: &str,
) -> Result<(), String> {
    if explicit && *field != value {
        return Err(format!(
            "{var} (envoyproxy/ratelimit's setting) contradicts --{flag}; set one of them"
        ));
    }
    *field = value;
    Ok(())
}

/// Percent-encodes a URL's user or password part (RFC 3986 unreserved
/// characters stay), so `@`, `/`, `#` or `:` in a password cannot end it.
fn userinfo_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A Redis URL for a reference-style `host:port` and `REDIS_AUTH`, which is
/// `password` or `user:password` (split at the first colon).
fn reference_redis_url(scheme: &str, node: &str, auth: Option<&str>) -> String {
    let node = node.trim();
    let bare = node.split_once("://").map_or(node, |(_, rest)| rest);
    match auth {
        None => format!("{scheme}://{bare}"),
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => format!(
                "{scheme}://{}:{}@{bare}",
                userinfo_escape(user),
                userinfo_escape(password)
            ),
            None => format!("{scheme}://:{}@{bare}", userinfo_escape(auth)),
        },
    }
}

impl ServeArgs {
    /// Applies the reference service's environment variables (so an existing
    /// Deployment can switch its image). `explicit(id)` tells whether a flag
    /// was set on the command line or by its `TOLLGATE_*` variable; a
    /// reference variable that contradicts one stops start-up.
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
        let on_off = |on: bool| if on { OnOff::On } else { OnOff::Off };

        if let Some(addr) = listen_addr(env, "GRPC_HOST", "GRPC_PORT")? {
            let explicit = explicit("grpc_addr");
            adopt(
                &mut self.grpc_addr,
                addr,
                explicit,
                "grpc-addr",
                "GRPC_PORT",
            )?;
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
            let explicit = explicit("admin_addr");
            adopt(
                &mut self.admin_addr,
                admin,
                explicit,
                "admin-addr",
                "PORT/DEBUG_PORT",
            )?;
        }
        if let Some(level) = env("LOG_LEVEL") {
            let explicit = explicit("log_level");
            adopt(
                &mut self.log_level,
                level.to_ascii_lowercase(),
                explicit,
                "log-level",
                "LOG_LEVEL",
            )?;
        }
        if let Some(format) = env("LOG_FORMAT") {
            let format = match format.to_ascii_lowercase().as_str() {
                "json" => LogFormat::Json,
                "text" => LogFormat::Text,
                other => return Err(format!("LOG_FORMAT={other}: expected text or json")),
            };
            let explicit = explicit("log_format");
            adopt(
                &mut self.log_format,
                format,
                explicit,
                "log-format",
                "LOG_FORMAT",
            )?;
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
            // The reference takes host:port (comma-separated for a cluster).
            let tls = truthy("REDIS_TLS")?.unwrap_or(false);
            let auth = env("REDIS_AUTH").filter(|a| !a.is_empty());
            let scheme = if tls { "rediss" } else { "redis" };
            let url = url
                .split(',')
                .map(|node| reference_redis_url(scheme, node, auth.as_deref()))
                .collect::<Vec<_>>()
                .join(",");
            let explicit_url = explicit("redis_url");
            adopt(
                &mut self.redis_url,
                RedisUrl(url),
                explicit_url,
                "redis-url",
                "REDIS_URL",
            )?;
            let wanted = redis_type.unwrap_or(StoreKind::Redis);
            let explicit = explicit("store");
            adopt(
                &mut self.store,
                wanted,
                explicit,
                "store",
                "REDIS_URL/REDIS_TYPE",
            )?;
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
            let explicit = explicit("response_headers");
            adopt(
                &mut self.response_headers,
                on_off(on),
                explicit,
                "response-headers",
                "LIMIT_RESPONSE_HEADERS_ENABLED",
            )?;
        }
        if let Some(on) = truthy("SHADOW_MODE")? {
            let explicit = explicit("shadow_mode");
            adopt(
                &mut self.shadow_mode,
                on,
                explicit,
                "shadow-mode",
                "SHADOW_MODE",
            )?;
        }
        if let Some(on) = truthy("QUOTA_MODE")? {
            let explicit = explicit("quota_mode");
            adopt(
                &mut self.quota_mode,
                on,
                explicit,
                "quota-mode",
                "QUOTA_MODE",
            )?;
        }
        if let Some(ratio) = env("NEAR_LIMIT_RATIO") {
            let ratio: f64 = ratio
                .parse()
                .map_err(|_| format!("NEAR_LIMIT_RATIO={ratio}: not a number"))?;
            let explicit = explicit("near_limit_ratio");
            adopt(
                &mut self.near_limit_ratio,
                ratio,
                explicit,
                "near-limit-ratio",
                "NEAR_LIMIT_RATIO",
            )?;
        }
        if let Some(bytes) = env("LOCAL_CACHE_SIZE_IN_BYTES") {
            let bytes: u64 = bytes
                .parse()
                .map_err(|_| format!("LOCAL_CACHE_SIZE_IN_BYTES={bytes}: not a number"))?;
            let explicit = explicit("over_limit_cache");
            adopt(
                &mut self.over_limit_cache,
                on_off(bytes > 0),
                explicit,
                "over-limit-cache",
                "LOCAL_CACHE_SIZE_IN_BYTES",
            )?;
        }
        if let Some(root) = env("RUNTIME_ROOT") {
            let sub = env("RUNTIME_SUBDIRECTORY").unwrap_or_default();
            let rules = vec![PathBuf::from(root).join(sub).join("config")];
            let explicit = explicit("rules");
            adopt(&mut self.rules, rules, explicit, "rules", "RUNTIME_ROOT")?;
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

/// A Redis URL, or a comma-separated list of them: it may hold a password,
/// so `Debug` and `Display` print it redacted; [`RedisUrl::expose`] gives
/// the real text to the one place that connects.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(pub String);

impl RedisUrl {
    /// The URL with its password, for connecting only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for RedisUrl {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self(s.to_owned()))
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", redact(&self.0))
    }
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&redact(&self.0))
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
    fn passwords_never_print() {
        let url = RedisUrl("redis://ann:s3cr%40t@h:6379/0,rediss://:pw@h2:1".into());
        for shown in [format!("{url}"), format!("{url:?}")] {
            assert!(!shown.contains("s3cr") && !shown.contains("pw@"), "{shown}");
            assert!(shown.contains("redis://ann:***@h:6379/0"), "{shown}");
            assert!(shown.contains("rediss://***@h2:1"), "{shown}");
        }
    }

    #[test]
    fn every_form_of_redis_auth_reaches_redis_intact() {
        for (auth, user, password) in [
            ("secret", None, "secret"),
            ("ann:secret", Some("ann"), "secret"),
            ("ann:p:a@s/s#w%rd", Some("ann"), "p:a@s/s#w%rd"),
            ("p@ss/w#rd", None, "p@ss/w#rd"),
        ] {
            let url = reference_redis_url("redis", "10.0.0.1:6379", Some(auth));
            let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                .unwrap_or_else(|e| panic!("{auth}: {e}"));
            let settings = info.redis_settings();
            assert_eq!(settings.username(), user, "{auth}");
            assert_eq!(settings.password(), Some(password), "{auth}");
            assert!(!redact(&url).contains(password), "{auth}");
        }
    }

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
