//! What `serve`'s flags make: the limiter's options, the store's, TLS
//! files. The server wires what these return; it copies no field itself.

use crate::limiter::{LimiterOptions, RequestBounds};
use crate::store::MemoryStoreOptions;
use crate::store::redis::{RedisOptions, RedisTarget};

use super::{LogFormat, OnOff, OnStoreError, ServeArgs, StoreKind};

/// Where counters live, as the flags ask.
#[derive(Debug)]
pub(crate) enum StoreOptions {
    /// The memory store.
    Memory(MemoryStoreOptions),
    /// Redis (standalone, Sentinel or Cluster), with a per-second pool
    /// when asked for.
    Redis(Box<RedisOptions>),
}

impl ServeArgs {
    /// The limiter's options.
    pub(crate) fn limiter_options(&self) -> LimiterOptions {
        LimiterOptions {
            failure_mode: self.failure_mode.into(),
            response_headers: self.response_headers == OnOff::On,
            over_limit_body: self.over_limit_body.into(),
            default_algorithm: self.rule_load.default_algorithm.into(),
            unavailable_on_store_error: self.on_store_error == OnStoreError::Unavailable,
            instances: self.instances,
            shadow_mode: self.shadow_mode,
            quota_mode: self.quota_mode,
            near_limit_ratio: self.near_limit_ratio,
            bounds: RequestBounds {
                descriptors: self.max_descriptors,
                entries: self.max_entries,
                value_bytes: self.max_value_bytes,
                request_bytes: self.max_request_bytes,
                checks: self.max_checks,
                request_id_bytes: self.max_request_id_bytes,
                held_ids: self.rule_load.max_held_ids,
            },
            max_metric_series: self.max_metric_series,
            max_label_bytes: self.max_label_bytes,
            refusal_log: self.limited.log_refusals.into(),
            refusal_log_rate: self.limited.refusal_log_rate,
            timed: true,
        }
    }

    /// The memory store's bounds (the live store's, and the candidate
    /// rules' own store's).
    pub(crate) fn memory_options(&self) -> MemoryStoreOptions {
        MemoryStoreOptions {
            max_keys: self.max_keys,
            ..MemoryStoreOptions::default()
        }
    }

    /// The store's options; the error names the flag or file at fault.
    pub(crate) fn store_options(&self) -> Result<StoreOptions, String> {
        let nodes =
            |list: &str| -> Vec<String> { list.split(',').map(|s| s.trim().to_owned()).collect() };
        if self.store != StoreKind::Memory && self.data.dir.is_some() {
            return Err("--data-dir keeps the memory store's counters; a Redis store keeps its own: drop --data-dir, or use --store memory".into());
        }
        let target = match self.store {
            StoreKind::Memory => {
                if self.redis_per_second_url.is_some() {
                    return Err("--redis-per-second-url needs a Redis store (--store redis, redis-cluster or redis-sentinel)".into());
                }
                return Ok(StoreOptions::Memory(self.memory_options()));
            }
            StoreKind::Redis => RedisTarget::Standalone(self.redis_url.expose().to_owned()),
            StoreKind::RedisSentinel => {
                let sentinels = nodes(self.redis_url.expose());
                let master = self
                    .redis_sentinel_master
                    .clone()
                    .ok_or("--store redis-sentinel needs --redis-sentinel-master")?;
                let scheme = if sentinels.iter().all(|s| s.starts_with("rediss://")) {
                    "rediss"
                } else {
                    "redis"
                };
                let auth = self.redis_master_auth.as_ref().map(|a| a.expose());
                RedisTarget::Sentinel {
                    master,
                    sentinels,
                    master_prefix: crate::store::redis::url_prefix(scheme, auth),
                }
            }
            StoreKind::RedisCluster => RedisTarget::Cluster(nodes(self.redis_url.expose())),
        };
        let mut options = RedisOptions::new(target);
        options.timeout = self.redis_timeout;
        options.prefix = self.redis_prefix.clone();
        options.breaker_threshold = self.redis_breaker;
        options.probe_timeout = self.redis_probe_timeout;
        options.over_limit_cache = self.over_limit_cache == OnOff::On;
        options.batch.requests = self.redis_batch as usize;
        options.max_owed_bytes = self.redis_max_owed_bytes;
        let read = |flag: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
        };
        if let Some(path) = &self.redis_tls_ca {
            options.tls_ca = Some(read("--redis-tls-ca", path)?);
        }
        if let (Some(cert), Some(key)) = (&self.redis_tls_cert, &self.redis_tls_key) {
            options.tls_client = Some((
                read("--redis-tls-cert", cert)?,
                read("--redis-tls-key", key)?,
            ));
        }
        if let Some(url) = &self.redis_per_second_url {
            let target = match self.redis_per_second_store {
                StoreKind::Redis => RedisTarget::Standalone(url.expose().to_owned()),
                StoreKind::RedisCluster => RedisTarget::Cluster(nodes(url.expose())),
                other => {
                    return Err(format!(
                        "--redis-per-second-store {other:?}: redis or redis-cluster"
                    ));
                }
            };
            let mut per_second = options.clone();
            per_second.target = target;
            options.per_second = Some(Box::new(per_second));
        }
        Ok(StoreOptions::Redis(Box::new(options)))
    }

    /// Whether logs are JSON.
    pub(crate) fn log_json(&self) -> bool {
        self.log_format == LogFormat::Json
    }
}
