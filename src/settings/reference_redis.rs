//! The reference's per-second Redis pool and the URL scheme its socket type
//! and TLS variables make.

use super::redis_url::{RedisUrl, reference_redis_url};
use super::reference_env::{adopt, bool_var, set_var};
use super::{ServeArgs, StoreKind};

impl ServeArgs {
    /// The per-second pool from `REDIS_PERSECOND=true` and its
    /// `REDIS_PERSECOND_URL`, `_TYPE`, `_AUTH`, `_TLS`, `_SOCKET_TYPE`.
    pub(super) fn apply_reference_per_second(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        explicit: &dyn Fn(&str) -> bool,
    ) -> Result<(), String> {
        if bool_var(env, "REDIS_PERSECOND")? != Some(true) {
            return Ok(());
        }
        let url = set_var(env, "REDIS_PERSECOND_URL")
            .ok_or("REDIS_PERSECOND=true needs REDIS_PERSECOND_URL")?;
        let kind = match set_var(env, "REDIS_PERSECOND_TYPE")
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
        let tls = bool_var(env, "REDIS_PERSECOND_TLS")?.unwrap_or(false);
        let scheme = redis_scheme(env, "PERSECOND_", tls, kind == StoreKind::RedisCluster)?;
        let auth = set_var(env, "REDIS_PERSECOND_AUTH");
        let url = url
            .split(',')
            .map(|node| reference_redis_url(scheme, node, auth.as_deref()))
            .collect::<Vec<_>>()
            .join(",");
        adopt(
            &mut self.redis_per_second_url,
            Some(RedisUrl(url)),
            explicit("redis_per_second_url"),
            "redis-per-second-url",
            "REDIS_PERSECOND_URL",
        )?;
        adopt(
            &mut self.redis_per_second_store,
            kind,
            explicit("redis_per_second_store"),
            "redis-per-second-store",
            "REDIS_PERSECOND_TYPE",
        )?;
        Ok(())
    }
}

/// The URL scheme for the reference's `REDIS_{pool}SOCKET_TYPE` (`tcp`, the
/// default, or `unix`) and `REDIS_{pool}TLS`; `pool` is empty for the main
/// pool, `PERSECOND_` for the per-second one. A Unix socket with TLS or a
/// cluster is refused, naming the variables.
pub(super) fn redis_scheme(
    env: &dyn Fn(&str) -> Option<String>,
    pool: &str,
    tls: bool,
    cluster: bool,
) -> Result<&'static str, String> {
    let socket_var = format!("REDIS_{pool}SOCKET_TYPE");
    let unix = match env(&socket_var)
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("" | "tcp") => false,
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
