//! Where Redis is and how the store behaves; URLs with their passwords
//! hidden.

use std::time::Duration;

use redis::RedisError;

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
    /// A master found through Redis Sentinel, and found again after a
    /// failover.
    Sentinel {
        /// The master's name as the sentinels know it.
        master: String,
        /// Sentinel URLs (`redis://[:password@]host:port`).
        sentinels: Vec<String>,
        /// The master's URL before its `host:port`: `redis://`,
        /// `rediss://`, with credentials (`redis://:password@`).
        master_prefix: String,
    },
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
            RedisTarget::Sentinel {
                master,
                sentinels,
                master_prefix,
            } => f
                .debug_struct("Sentinel")
                .field("master", master)
                .field("sentinels", &redact(&sentinels.join(",")))
                .field("master_prefix", &redact(&format!("{master_prefix}host")))
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
    /// How long the PING that confirms an outage (and the ones that look
    /// for the end of it) may take: longer than `timeout`, so a Redis that
    /// is slow under load is not taken for a Redis that is down.
    pub probe_timeout: Duration,
    /// Cache keys known to be over their limit until they reset.
    pub over_limit_cache: bool,
    /// PEM CA certificates to trust for `rediss://` instead of the system's.
    pub tls_ca: Option<Vec<u8>>,
    /// PEM client certificate chain and key for `rediss://` (mutual TLS).
    pub tls_client: Option<(Vec<u8>, Vec<u8>)>,
    /// How many concurrent requests one script call may carry.
    pub batch: BatchBounds,
    /// Limits of one second on a Redis of their own (the reference's
    /// `REDIS_PERSECOND`): its options.
    pub per_second: Option<Box<RedisOptions>>,
    /// The most bytes of releases kept while Redis is down, to be sent when
    /// it answers again (`--redis-max-owed-bytes`; 0 keeps none).
    pub max_owed_bytes: usize,
}

/// How much one call may carry: the script runs while Redis serves no one
/// else, so a call's size bounds everyone's wait.
#[derive(Debug, Clone, Copy)]
pub struct BatchBounds {
    /// Requests per call (`--redis-batch`); 1 sends every request alone.
    pub requests: usize,
    /// Checks per call; a request larger than this goes alone.
    pub checks: usize,
}

impl Default for BatchBounds {
    fn default() -> Self {
        Self {
            requests: 64,
            checks: 1024,
        }
    }
}

impl RedisOptions {
    /// Options for `target` with the defaults.
    pub fn new(target: RedisTarget) -> Self {
        Self {
            target,
            prefix: "tollgate:".into(),
            timeout: Duration::from_millis(100),
            breaker_threshold: 5,
            probe_interval: Duration::from_millis(250),
            probe_timeout: Duration::from_secs(1),
            over_limit_cache: false,
            tls_ca: None,
            tls_client: None,
            batch: BatchBounds::default(),
            per_second: None,
            max_owed_bytes: 16 << 20,
        }
    }
}

impl RedisOptions {
    /// Checks what can be checked before connecting, so that a bad URL or
    /// prefix stops start-up.
    pub(super) fn validate(&self) -> Result<(), StoreError> {
        // A brace would break the hash tag that keeps a descriptor's keys in one slot.
        if self.prefix.contains(['{', '}']) {
            return Err(StoreError::Config(format!(
                "Redis key prefix '{}' must not contain '{{' or '}}'",
                self.prefix
            )));
        }
        let urls = match &self.target {
            RedisTarget::Standalone(url) => vec![url.as_str()],
            RedisTarget::Cluster(nodes) => nodes.iter().map(String::as_str).collect(),
            RedisTarget::Sentinel { sentinels, .. } => {
                sentinels.iter().map(String::as_str).collect()
            }
        };
        if cfg!(not(feature = "insecure-redis-tls"))
            && urls.iter().any(|u| u.ends_with("#insecure"))
        {
            return Err(StoreError::Config(
                "this build does not skip Redis certificate checks (#insecure): give Redis's CA with --redis-tls-ca (or build with --features insecure-redis-tls)".into(),
            ));
        }
        // Validate the target now, so a bad URL stops start-up.
        match &self.target {
            RedisTarget::Standalone(url) => {
                redis::Client::open(url.as_str()).map_err(|e| config_error(url, &e))?;
            }
            RedisTarget::Cluster(nodes) => {
                redis::cluster::ClusterClient::new(nodes.clone())
                    .map_err(|e| config_error(&nodes.join(","), &e))?;
            }
            RedisTarget::Sentinel {
                master,
                sentinels,
                master_prefix,
            } => {
                if master.is_empty() || sentinels.is_empty() {
                    return Err(StoreError::Config(
                        "Redis Sentinel needs the master's name and at least one sentinel".into(),
                    ));
                }
                for url in sentinels {
                    redis::Client::open(url.as_str()).map_err(|e| config_error(url, &e))?;
                }
                let example = format!("{master_prefix}127.0.0.1:6379");
                redis::Client::open(example.as_str()).map_err(|e| config_error(&example, &e))?;
            }
        }
        Ok(())
    }
}

fn config_error(target: &str, e: &RedisError) -> StoreError {
    StoreError::Config(format!("invalid Redis address '{}': {e}", redact(target)))
}

/// Percent-encodes a URL's user or password part (RFC 3986 unreserved
/// characters stay), so `@`, `/`, `#` or `:` in a password cannot end it.
pub fn userinfo_escape(text: &str) -> String {
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

/// `scheme://[user:]password@` for a password given as `password` or
/// `user:password` (split at the first colon), escaped; `scheme://`
/// without one.
pub fn url_prefix(scheme: &str, auth: Option<&str>) -> String {
    match auth {
        None => format!("{scheme}://"),
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => format!(
                "{scheme}://{}:{}@",
                userinfo_escape(user),
                userinfo_escape(password)
            ),
            None => format!("{scheme}://:{}@", userinfo_escape(auth)),
        },
    }
}
