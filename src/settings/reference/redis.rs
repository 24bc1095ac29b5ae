//! The reference's Redis variables: the main pool (`REDIS_URL` with its
//! `REDIS_TYPE`, `REDIS_AUTH`, `REDIS_TLS`, `REDIS_SOCKET_TYPE`,
//! `REDIS_SENTINEL_AUTH`), its TLS files, timeout and key prefix, and the
//! per-second pool (`REDIS_PERSECOND` and its `REDIS_PERSECOND_*`).

use std::path::PathBuf;

use super::Vars;
use crate::settings::redis_url::{RedisUrl, reference_redis_url};
use crate::settings::{ServeArgs, StoreKind};

/// `BACKEND_TYPE`: redis is the only backend both have.
pub(super) fn backend_type(_: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    match vars
        .set("BACKEND_TYPE")
        .map(|t| t.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("redis") => Ok(()),
        Some(other) => Err(format!(
            "BACKEND_TYPE={other}: Tollgate supports redis (and its own memory store)"
        )),
    }
}

/// `--store` and `--redis-url` (and for Sentinel `--redis-sentinel-master`
/// and `--redis-master-auth`) from `REDIS_URL`, `REDIS_TYPE`, `REDIS_AUTH`,
/// `REDIS_TLS`, `REDIS_SOCKET_TYPE` and `REDIS_SENTINEL_AUTH`.
pub(super) fn main_pool(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    let redis_type = match vars
        .set("REDIS_TYPE")
        .map(|t| t.to_ascii_lowercase())
        .as_deref()
    {
        None => None,
        Some("single") => Some(StoreKind::Redis),
        Some("cluster") => Some(StoreKind::RedisCluster),
        Some("sentinel") => Some(StoreKind::RedisSentinel),
        Some(other) => {
            return Err(format!(
                "REDIS_TYPE={other}: Tollgate supports single, cluster and sentinel"
            ));
        }
    };
    let Some(url) = vars.set("REDIS_URL") else {
        if redis_type.is_some() {
            return Err("REDIS_TYPE is set without REDIS_URL".into());
        }
        return Ok(());
    };
    // The reference takes host:port (comma-separated for a cluster), or a
    // socket path with REDIS_SOCKET_TYPE=unix.
    let tls = vars.boolean("REDIS_TLS")?.unwrap_or(false);
    let auth = vars.set("REDIS_AUTH");
    let cluster = redis_type == Some(StoreKind::RedisCluster);
    let scheme = redis_scheme(vars, "", tls, cluster)?;
    let url = if redis_type == Some(StoreKind::RedisSentinel) {
        // "master,sentinel:port,...": the sentinels have their own password
        // (REDIS_SENTINEL_AUTH); REDIS_AUTH is the master's.
        let mut parts = url.split(',');
        let master = parts.next().unwrap_or_default().trim().to_owned();
        if master.is_empty() || master.contains(':') {
            return Err(format!(
                "REDIS_URL={url}: with REDIS_TYPE=sentinel, the master's name first, then the sentinels (mymaster,host:26379,...)"
            ));
        }
        let sentinel_auth = vars.set("REDIS_SENTINEL_AUTH");
        let sentinels: Vec<String> = parts
            .map(|node| reference_redis_url(scheme, node, sentinel_auth.as_deref()))
            .collect();
        if sentinels.is_empty() {
            return Err(format!(
                "REDIS_URL={url}: no sentinel after the master's name"
            ));
        }
        vars.adopt(
            &mut args.redis_sentinel_master,
            Some(master),
            "redis_sentinel_master",
            "REDIS_URL",
        )?;
        if let Some(auth) = auth {
            vars.adopt(
                &mut args.redis_master_auth,
                Some(RedisUrl(auth)),
                "redis_master_auth",
                "REDIS_AUTH",
            )?;
        }
        sentinels.join(",")
    } else {
        if vars.set("REDIS_SENTINEL_AUTH").is_some() {
            return Err("REDIS_SENTINEL_AUTH is set but REDIS_TYPE is not sentinel".into());
        }
        nodes(scheme, &url, auth.as_deref())
    };
    vars.adopt(&mut args.redis_url, RedisUrl(url), "redis_url", "REDIS_URL")?;
    let wanted = redis_type.unwrap_or(StoreKind::Redis);
    vars.adopt(&mut args.store, wanted, "store", "REDIS_URL/REDIS_TYPE")
}

/// `--redis-tls-cert` and `--redis-tls-key` from `REDIS_TLS_CLIENT_CERT`
/// and `REDIS_TLS_CLIENT_KEY`, which go together.
pub(super) fn client_tls(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    match (
        vars.set("REDIS_TLS_CLIENT_CERT"),
        vars.set("REDIS_TLS_CLIENT_KEY"),
    ) {
        (None, None) => Ok(()),
        (Some(cert), Some(key)) => {
            vars.adopt(
                &mut args.redis_tls_cert,
                Some(PathBuf::from(cert)),
                "redis_tls_cert",
                "REDIS_TLS_CLIENT_CERT",
            )?;
            vars.adopt(
                &mut args.redis_tls_key,
                Some(PathBuf::from(key)),
                "redis_tls_key",
                "REDIS_TLS_CLIENT_KEY",
            )
        }
        _ => Err("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together".into()),
    }
}

/// The per-second pool from `REDIS_PERSECOND=true` and its
/// `REDIS_PERSECOND_URL`, `_TYPE`, `_AUTH`, `_TLS`, `_SOCKET_TYPE`.
pub(super) fn per_second(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if vars.boolean("REDIS_PERSECOND")? != Some(true) {
        return Ok(());
    }
    let url = vars
        .set("REDIS_PERSECOND_URL")
        .ok_or("REDIS_PERSECOND=true needs REDIS_PERSECOND_URL")?;
    let kind = match vars
        .set("REDIS_PERSECOND_TYPE")
        .map(|t| t.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("single") => StoreKind::Redis,
        Some("cluster") => StoreKind::RedisCluster,
        Some(other) => {
            return Err(format!(
                "REDIS_PERSECOND_TYPE={other}: Tollgate's per-second pool is single or cluster"
            ));
        }
    };
    let tls = vars.boolean("REDIS_PERSECOND_TLS")?.unwrap_or(false);
    let scheme = redis_scheme(vars, "PERSECOND_", tls, kind == StoreKind::RedisCluster)?;
    let url = nodes(scheme, &url, vars.set("REDIS_PERSECOND_AUTH").as_deref());
    vars.adopt(
        &mut args.redis_per_second_url,
        Some(RedisUrl(url)),
        "redis_per_second_url",
        "REDIS_PERSECOND_URL",
    )?;
    vars.adopt(
        &mut args.redis_per_second_store,
        kind,
        "redis_per_second_store",
        "REDIS_PERSECOND_TYPE",
    )
}

/// The reference's `host:port,...` as our comma-separated URLs.
fn nodes(scheme: &str, list: &str, auth: Option<&str>) -> String {
    list.split(',')
        .map(|node| reference_redis_url(scheme, node, auth))
        .collect::<Vec<_>>()
        .join(",")
}

/// The URL scheme for `REDIS_{pool}SOCKET_TYPE` (`tcp`, the default, or
/// `unix`) and `REDIS_{pool}TLS`; `pool` is empty for the main pool,
/// `PERSECOND_` for the per-second one. A Unix socket with TLS or a cluster
/// is refused, naming the variables.
fn redis_scheme(
    vars: &Vars<'_>,
    pool: &str,
    tls: bool,
    cluster: bool,
) -> Result<&'static str, String> {
    let socket_var = format!("REDIS_{pool}SOCKET_TYPE");
    let unix = match vars
        .set(&socket_var)
        .map(|t| t.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("tcp") => false,
        Some("unix") => true,
        Some(other) => return Err(format!("{socket_var}={other}: expected tcp or unix")),
    };
    if unix && (tls || cluster) {
        return Err(format!(
            "{socket_var}=unix: a Unix socket takes neither REDIS_{pool}TLS nor REDIS_{pool}TYPE=cluster"
        ));
    }
    Ok(match (unix, tls) {
        (true, _) => "redis+unix",
        (false, true) => "rediss",
        (false, false) => "redis",
    })
}

/// `--redis-prefix` from `CACHE_KEY_PREFIX`.
pub(super) fn redis_prefix(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(prefix) = vars.set("CACHE_KEY_PREFIX") {
        vars.adopt(
            &mut args.redis_prefix,
            prefix,
            "redis_prefix",
            "CACHE_KEY_PREFIX",
        )?;
    }
    Ok(())
}

/// `--redis-tls-ca` from `REDIS_TLS_CACERT`.
pub(super) fn redis_tls_ca(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(ca) = vars.set("REDIS_TLS_CACERT") {
        let ca = Some(PathBuf::from(ca));
        vars.adopt(
            &mut args.redis_tls_ca,
            ca,
            "redis_tls_ca",
            "REDIS_TLS_CACERT",
        )?;
    }
    Ok(())
}

/// `--redis-timeout` from `REDIS_TIMEOUT`.
pub(super) fn redis_timeout(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(timeout) = vars.duration("REDIS_TIMEOUT")? {
        vars.adopt(
            &mut args.redis_timeout,
            timeout,
            "redis_timeout",
            "REDIS_TIMEOUT",
        )?;
    }
    Ok(())
}
