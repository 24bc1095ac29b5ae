//! The reference service's environment variables, so an existing
//! envoyproxy/ratelimit Deployment can switch its image.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::redis_url::{RedisUrl, reference_redis_url};
use super::reference_env::adopt;
use super::reference_redis::redis_scheme;
use super::{LogFormat, OnOff, ServeArgs, StoreKind};

impl ServeArgs {
    /// Applies the reference service's environment variables (so an existing
    /// Deployment can switch its image). `explicit(id)` tells whether a flag
    /// was set on the command line or by its `TOLLGATE_*` variable; a
    /// reference variable that contradicts one stops start-up.
    pub(crate) fn apply_reference_env(
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
        super::reference_vars::refused_vars(env)?;
        self.rule_load.apply_reference_env(env);

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
        for (host, port) in [("HOST", "PORT"), ("DEBUG_HOST", "DEBUG_PORT")] {
            if let Some(addr) = listen_addr(env, host, port)?
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
                super::values::reference_log_level(&level)?.to_owned(),
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
            Some("sentinel") => Some(StoreKind::RedisSentinel),
            Some(other) => {
                return Err(format!(
                    "REDIS_TYPE={other}: Tollgate supports single, cluster and sentinel"
                ));
            }
        };
        if let Some(url) = env("REDIS_URL") {
            // The reference takes host:port (comma-separated for a cluster),
            // or a socket path with REDIS_SOCKET_TYPE=unix.
            let tls = truthy("REDIS_TLS")?.unwrap_or(false);
            let auth = env("REDIS_AUTH").filter(|a| !a.is_empty());
            let cluster = redis_type == Some(StoreKind::RedisCluster);
            let scheme = redis_scheme(env, "", tls, cluster)?;
            let url = if redis_type == Some(StoreKind::RedisSentinel) {
                // "master,sentinel:port,...": the sentinels have their own
                // password (REDIS_SENTINEL_AUTH); REDIS_AUTH is the master's.
                let mut parts = url.split(',');
                let master = parts.next().unwrap_or_default().trim().to_owned();
                if master.is_empty() || master.contains(':') {
                    return Err(format!(
                        "REDIS_URL={url}: with REDIS_TYPE=sentinel, the master's name first, then the sentinels (mymaster,host:26379,...)"
                    ));
                }
                let sentinel_auth = env("REDIS_SENTINEL_AUTH").filter(|a| !a.is_empty());
                let sentinels: Vec<String> = parts
                    .map(|node| reference_redis_url(scheme, node, sentinel_auth.as_deref()))
                    .collect();
                if sentinels.is_empty() {
                    return Err(format!(
                        "REDIS_URL={url}: no sentinel after the master's name"
                    ));
                }
                adopt(
                    &mut self.redis_sentinel_master,
                    Some(master),
                    explicit("redis_sentinel_master"),
                    "redis-sentinel-master",
                    "REDIS_URL",
                )?;
                if let Some(auth) = auth.clone() {
                    adopt(
                        &mut self.redis_master_auth,
                        Some(RedisUrl(auth)),
                        explicit("redis_master_auth"),
                        "redis-master-auth",
                        "REDIS_AUTH",
                    )?;
                }
                sentinels.join(",")
            } else {
                if env("REDIS_SENTINEL_AUTH").is_some_and(|a| !a.is_empty()) {
                    return Err("REDIS_SENTINEL_AUTH is set but REDIS_TYPE is not sentinel".into());
                }
                url.split(',')
                    .map(|node| reference_redis_url(scheme, node, auth.as_deref()))
                    .collect::<Vec<_>>()
                    .join(",")
            };
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
        if let Some(timeout) = env("REDIS_TIMEOUT").filter(|t| !t.is_empty()) {
            let timeout = super::parse_duration(&timeout)
                .map_err(|e| format!("REDIS_TIMEOUT={timeout}: {e}"))?;
            let explicit = explicit("redis_timeout");
            adopt(
                &mut self.redis_timeout,
                timeout,
                explicit,
                "redis-timeout",
                "REDIS_TIMEOUT",
            )?;
        }
        if let Some(ca) = env("REDIS_TLS_CACERT").filter(|c| !c.is_empty()) {
            let explicit = explicit("redis_tls_ca");
            adopt(
                &mut self.redis_tls_ca,
                Some(PathBuf::from(ca)),
                explicit,
                "redis-tls-ca",
                "REDIS_TLS_CACERT",
            )?;
        }
        self.apply_reference_per_second(env, explicit)?;
        let client_cert = env("REDIS_TLS_CLIENT_CERT").filter(|c| !c.is_empty());
        let client_key = env("REDIS_TLS_CLIENT_KEY").filter(|c| !c.is_empty());
        match (client_cert, client_key) {
            (None, None) => {}
            (Some(cert), Some(key)) => {
                adopt(
                    &mut self.redis_tls_cert,
                    Some(PathBuf::from(cert)),
                    explicit("redis_tls_cert"),
                    "redis-tls-cert",
                    "REDIS_TLS_CLIENT_CERT",
                )?;
                adopt(
                    &mut self.redis_tls_key,
                    Some(PathBuf::from(key)),
                    explicit("redis_tls_key"),
                    "redis-tls-key",
                    "REDIS_TLS_CLIENT_KEY",
                )?;
            }
            _ => {
                return Err("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together".into());
            }
        }
        if let Some(prefix) = env("CACHE_KEY_PREFIX").filter(|p| !p.is_empty()) {
            let explicit = explicit("redis_prefix");
            adopt(
                &mut self.redis_prefix,
                prefix,
                explicit,
                "redis-prefix",
                "CACHE_KEY_PREFIX",
            )?;
        }
        self.apply_reference_tls(env, explicit)?;
        self.apply_reference_stats(env, explicit)?;
        self.apply_reference_tracing(env, explicit)?;
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
        let xds = self.apply_reference_xds(env, explicit)?;
        if let Some(root) = env("RUNTIME_ROOT").filter(|_| !xds) {
            let sub = env("RUNTIME_SUBDIRECTORY").unwrap_or_default();
            let app = env("RUNTIME_APPDIRECTORY")
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| "config".into());
            let rules = vec![PathBuf::from(root).join(sub).join(app)];
            let explicit = explicit("rules");
            adopt(&mut self.rules, rules, explicit, "rules", "RUNTIME_ROOT")?;
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
