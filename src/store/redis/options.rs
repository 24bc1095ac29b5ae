//! Where Redis is and how the store behaves; URLs with their passwords
//! hidden.

use std::time::Duration;

use redis::RedisError;

use super::BatchBounds;
use crate::store::StoreError;

/// Every password in a comma-separated list of URLs replaced by `***`
/// (`redis://user:***@host`, `redis://***@host`).
pub fn redact(urls: &str) -> String {
    urls.split(',')
        .map(|url| {
            let Some((scheme, rest)) = url.split_once("://") else {
                return url.to_owned();
            };
            let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let (authority, path) = rest.split_at(authority_end);
            match authority.rsplit_once('@') {
                None => url.to_owned(),
                Some((userinfo, host)) => {
                    let user = userinfo.split_once(':').map_or("", |(u, _)| u);
                    let shown = if user.is_empty() {
                        "***".to_owned()
                    } else {
                        format!("{user}:***")
                    };
                    format!("{scheme}://{shown}@{host}{path}")
                }
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Which Redis deployment. `Debug` redacts passwords.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One Redis server (`redis://` or `rediss://` URL).
    Standalone(String),
    /// Redis Cluster seed nodes.
    Cluster(Vec<String>),
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Standalone(url) => {
                f.debug_tuple("Standalone").field(&redact(url)).finish()
            }
            RedisTarget::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(&redact(&nodes.join(",")))
                .finish(),
        }
    }
}

/// How the Redis store behaves.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Where Redis is.
    pub target: RedisTarget,
    /// Prefix of every key.
    pub prefix: String,
    /// Longest wait for one call (connect included).
    pub timeout: Duration,
    /// Failures in a row that open the circuit.
    pub breaker_threshold: u32,
    /// How often an open circuit probes Redis.
    pub probe_interval: Duration,
    /// Cache keys known to be over their limit until they reset.
    pub over_limit_cache: bool,
    /// PEM CA certificates to trust for `rediss://` instead of the system's.
    pub tls_ca: Option<Vec<u8>>,
    /// How many concurrent requests one script call may carry.
    pub batch: BatchBounds,
}

impl RedisOptions {
    /// Options for `target` with the defaults.
    pub fn new(target: RedisTarget) -> Self {
        Self {
            target,
            prefix: "tollgate:".into(),
            timeout: Duration::from_millis(10),
            breaker_threshold: 5,
            probe_interval: Duration::from_millis(250),
            over_limit_cache: false,
            tls_ca: None,
            batch: BatchBounds::default(),
        }
    }
}

pub(super) fn config_error(target: &str, e: &RedisError) -> StoreError {
    StoreError::Config(format!("invalid Redis address '{}': {e}", redact(target)))
}
