//! Every environment variable envoyproxy/ratelimit reads
//! (`src/settings/settings.go`), and what Tollgate does with each: none is
//! silently ignored. A variable is honoured (mapped to a Tollgate setting by
//! the function its entry carries), accepted with no effect for a stated
//! reason, or refused at start-up, by name, when it asks for something
//! Tollgate does not do.

use super::{Apply, limiter, listen, redis, stats, xds};

/// What Tollgate does with one reference variable.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Handling {
    /// Mapped to a Tollgate setting.
    Honoured {
        /// The setting, as the documentation states it (read by the test
        /// that keeps docs/compatibility.md's table).
        #[cfg_attr(not(test), allow(dead_code))]
        setting: &'static str,
        /// What sets it (with the variables read together with this one).
        apply: Apply,
    },
    /// Accepted with no effect, for this reason.
    NoEffect(#[cfg_attr(not(test), allow(dead_code))] &'static str),
    /// Refused at start-up (with this reason) unless its value is one of
    /// `harmless` (compared case-insensitively; empty is always harmless).
    Refused {
        /// Values that ask for nothing Tollgate lacks.
        harmless: &'static [&'static str],
        /// Why other values are refused.
        why: &'static str,
    },
}

/// One reference variable.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReferenceVar {
    /// Its name.
    pub name: &'static str,
    /// What Tollgate does with it.
    pub handling: Handling,
}

const fn honoured(name: &'static str, setting: &'static str, apply: Apply) -> ReferenceVar {
    ReferenceVar {
        name,
        handling: Handling::Honoured { setting, apply },
    }
}

const fn no_effect(name: &'static str, why: &'static str) -> ReferenceVar {
    ReferenceVar {
        name,
        handling: Handling::NoEffect(why),
    }
}

const fn refused(
    name: &'static str,
    harmless: &'static [&'static str],
    why: &'static str,
) -> ReferenceVar {
    ReferenceVar {
        name,
        handling: Handling::Refused { harmless, why },
    }
}

const FALSE: &[&str] = &["false", "0", "no"];
const POOLS: &str =
    "Tollgate multiplexes one connection per worker and batches requests into script calls itself";
const MEMCACHE: &str = "read only with BACKEND_TYPE=memcache, which Tollgate refuses";

/// Every variable of envoyproxy/ratelimit's settings, in its order.
pub(crate) const REFERENCE_VARS: &[ReferenceVar] = &[
    refused("PROTO", &["tcp"], "Tollgate serves gRPC over TCP"),
    honoured(
        "HOST",
        "--admin-addr HOST:PORT (every admin endpoint answers on each admin address)",
        listen::admin_addrs,
    ),
    honoured("PORT", "--admin-addr HOST:PORT", listen::admin_addrs),
    honoured(
        "DEBUG_HOST",
        "--admin-addr DEBUG_HOST:DEBUG_PORT",
        listen::admin_addrs,
    ),
    honoured(
        "DEBUG_PORT",
        "--admin-addr DEBUG_HOST:DEBUG_PORT",
        listen::admin_addrs,
    ),
    refused(
        "GRPC_UDS",
        &[],
        "listening on a Unix socket is not supported by Tollgate yet",
    ),
    honoured(
        "GRPC_HOST",
        "--grpc-addr GRPC_HOST:GRPC_PORT",
        listen::grpc_addr,
    ),
    honoured(
        "GRPC_PORT",
        "--grpc-addr GRPC_HOST:GRPC_PORT",
        listen::grpc_addr,
    ),
    refused(
        "GRPC_MAX_CONNECTION_AGE",
        &["24h"],
        "Tollgate closes idle connections (--idle-timeout) but has no maximum connection age",
    ),
    refused(
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        &["1h"],
        "Tollgate has no maximum connection age",
    ),
    honoured(
        "GRPC_SERVER_USE_TLS",
        "TLS on gRPC only (--admin-tls off), from the two below; TLS files without it stop start-up",
        listen::grpc_tls,
    ),
    honoured("GRPC_SERVER_TLS_CERT", "--tls-cert", listen::grpc_tls),
    honoured("GRPC_SERVER_TLS_KEY", "--tls-key", listen::grpc_tls),
    honoured(
        "GRPC_CLIENT_TLS_CACERT",
        "--tls-client-ca",
        listen::grpc_tls,
    ),
    honoured(
        "GRPC_CLIENT_TLS_SAN",
        "--tls-client-san: client certificates must carry this DNS name or IP address",
        listen::grpc_tls,
    ),
    honoured("LOG_LEVEL", "--log-level", listen::log_level),
    honoured("LOG_FORMAT", "--log-format", listen::log_format),
    honoured(
        "CONFIG_TYPE",
        "FILE: rule files; GRPC_XDS_SOTW: --rules-xds (rule files, RUNTIME_* included, are then not read); anything else stops start-up",
        xds::xds,
    ),
    honoured(
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "--xds-wait-for-rules off when true (ready before the first rules arrive)",
        xds::xds,
    ),
    honoured("CONFIG_GRPC_XDS_NODE_ID", "--xds-node-id", xds::xds),
    honoured(
        "CONFIG_GRPC_XDS_NODE_METADATA",
        "--xds-node-metadata (key=value,...)",
        xds::xds,
    ),
    honoured(
        "CONFIG_GRPC_XDS_SERVER_URL",
        "--rules-xds host:port (default localhost:18000) with CONFIG_TYPE=GRPC_XDS_SOTW",
        xds::xds,
    ),
    honoured(
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "--xds-connect-retry",
        xds::xds,
    ),
    honoured(
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "--xds-header (the reference's key:value,... form)",
        xds::xds,
    ),
    honoured(
        "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        "https:// in --rules-xds",
        xds::xds,
    ),
    honoured(
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "--xds-client-cert",
        xds::xds,
    ),
    honoured(
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "--xds-client-key",
        xds::xds,
    ),
    honoured("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "--xds-ca", xds::xds),
    honoured(
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        "--xds-server-name",
        xds::xds,
    ),
    honoured(
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "--xds-backoff-initial",
        xds::xds,
    ),
    honoured(
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "--xds-backoff-max",
        xds::xds,
    ),
    honoured(
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "--xds-backoff-random-factor (each wait is randomised by this fraction; waits double up to the maximum)",
        xds::xds,
    ),
    honoured(
        "XDS_CLIENT_BACKOFF_JITTER",
        "--xds-backoff-random-factor 0 when false",
        xds::xds,
    ),
    honoured(
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        "--xds-max-message-bytes (0: the default, 4 MiB)",
        xds::xds,
    ),
    honoured(
        "USE_DOG_STATSD",
        "--dogstatsd on (tags from EXTRA_TAGS on every line)",
        stats::stats,
    ),
    refused(
        "USE_DOG_STATSD_MOGRIFIERS",
        &[],
        "DogStatsD mogrifiers (names rewritten into tags) are not supported by Tollgate yet",
    ),
    honoured(
        "USE_STATSD",
        "--statsd STATSD_HOST:STATSD_PORT over TCP, when true (run as ratelimit, unset means off, not the reference's on)",
        stats::stats,
    ),
    honoured("STATSD_HOST", "--statsd (default localhost)", stats::stats),
    honoured("STATSD_PORT", "--statsd (default 8125)", stats::stats),
    honoured(
        "EXTRA_TAGS",
        "--statsd-tags (key:value,...; sent with USE_DOG_STATSD)",
        stats::stats,
    ),
    honoured(
        "STATS_FLUSH_INTERVAL",
        "--statsd-flush-interval",
        stats::stats,
    ),
    honoured(
        "DISABLE_STATS",
        "when true, no statsd and no PROMETHEUS_ADDR endpoint (Tollgate's own /metrics stays)",
        stats::stats,
    ),
    honoured(
        "USE_PROMETHEUS",
        "--reference-metrics-addr PROMETHEUS_ADDR (default :9090): the reference's stats through PROMETHEUS_MAPPER_YAML",
        stats::stats,
    ),
    honoured("PROMETHEUS_ADDR", "--reference-metrics-addr", stats::stats),
    honoured("PROMETHEUS_PATH", "--reference-metrics-path", stats::stats),
    honoured("PROMETHEUS_MAPPER_YAML", "--statsd-mapping", stats::stats),
    refused(
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        FALSE,
        "the response time histogram is in seconds",
    ),
    honoured(
        "RUNTIME_ROOT",
        "--rules ROOT/SUBDIRECTORY/APPDIRECTORY",
        xds::runtime,
    ),
    honoured(
        "RUNTIME_SUBDIRECTORY",
        "--rules ROOT/SUBDIRECTORY/APPDIRECTORY",
        xds::runtime,
    ),
    honoured(
        "RUNTIME_APPDIRECTORY",
        "--rules ROOT/SUBDIRECTORY/APPDIRECTORY (default config)",
        xds::runtime,
    ),
    no_effect(
        "RUNTIME_IGNOREDOTFILES",
        "Tollgate always skips files and directories whose name starts with a dot",
    ),
    no_effect(
        "RUNTIME_WATCH_ROOT",
        "Tollgate watches the rules directory and its subdirectories (--watch-rules)",
    ),
    no_effect(
        "EXPIRATION_JITTER_MAX_SECONDS",
        "Tollgate's keys expire exactly when their window can no longer matter",
    ),
    honoured(
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "--over-limit-cache on when above 0",
        limiter::over_limit_cache,
    ),
    honoured(
        "NEAR_LIMIT_RATIO",
        "--near-limit-ratio",
        limiter::near_limit_ratio,
    ),
    honoured(
        "CACHE_KEY_PREFIX",
        "--redis-prefix (Tollgate's keys differ from the reference's all the same)",
        redis::redis_prefix,
    ),
    honoured(
        "BACKEND_TYPE",
        "redis accepted (the store follows REDIS_URL); anything else stops start-up",
        redis::backend_type,
    ),
    no_effect(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "Tollgate never counts a refused request, whatever this says",
    ),
    honoured(
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        "--response-headers",
        limiter::response_headers,
    ),
    refused(
        "LIMIT_LIMIT_HEADER",
        &["ratelimit-limit"],
        "Tollgate sends the IETF draft's RateLimit and RateLimit-Policy headers",
    ),
    refused(
        "LIMIT_REMAINING_HEADER",
        &["ratelimit-remaining"],
        "Tollgate sends the IETF draft's RateLimit and RateLimit-Policy headers",
    ),
    refused(
        "LIMIT_RESET_HEADER",
        &["ratelimit-reset"],
        "Tollgate sends the IETF draft's RateLimit and RateLimit-Policy headers",
    ),
    refused(
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        FALSE,
        "Tollgate does not start without loadable rules, so it is never up without them",
    ),
    honoured(
        "REDIS_SOCKET_TYPE",
        "tcp, or unix: REDIS_URL is a socket path (redis+unix://)",
        redis::main_pool,
    ),
    honoured(
        "REDIS_TYPE",
        "--store: single is redis, cluster is redis-cluster, sentinel is redis-sentinel (REDIS_URL: the master's name, then the sentinels); anything else stops start-up",
        redis::main_pool,
    ),
    honoured(
        "REDIS_URL",
        "--store redis and --redis-url: host:port (comma-separated for a cluster) made into URLs with REDIS_AUTH and REDIS_TLS",
        redis::main_pool,
    ),
    no_effect("REDIS_POOL_SIZE", POOLS),
    honoured(
        "REDIS_AUTH",
        "the password (or user:password) in --redis-url, escaped",
        redis::main_pool,
    ),
    honoured("REDIS_TLS", "rediss:// in --redis-url", redis::main_pool),
    honoured(
        "REDIS_TLS_CLIENT_CERT",
        "--redis-tls-cert (mutual TLS to Redis)",
        redis::client_tls,
    ),
    honoured("REDIS_TLS_CLIENT_KEY", "--redis-tls-key", redis::client_tls),
    honoured("REDIS_TLS_CACERT", "--redis-tls-ca", redis::redis_tls_ca),
    refused(
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        FALSE,
        "Tollgate always verifies Redis's certificate; give its CA with REDIS_TLS_CACERT",
    ),
    no_effect("REDIS_PIPELINE_WINDOW", POOLS),
    no_effect("REDIS_PIPELINE_LIMIT", POOLS),
    no_effect("REDIS_CLUSTER_PIPELINE_PARALLELISM", POOLS),
    honoured(
        "REDIS_PERSECOND",
        "when true, limits whose period is one second go to their own Redis (--redis-per-second-url), a refused request spending nothing on either",
        redis::per_second,
    ),
    honoured(
        "REDIS_PERSECOND_SOCKET_TYPE",
        "tcp, or unix (redis+unix://)",
        redis::per_second,
    ),
    honoured(
        "REDIS_PERSECOND_TYPE",
        "--redis-per-second-store: single or cluster; sentinel stops start-up",
        redis::per_second,
    ),
    honoured(
        "REDIS_PERSECOND_URL",
        "--redis-per-second-url",
        redis::per_second,
    ),
    no_effect("REDIS_PERSECOND_POOL_SIZE", POOLS),
    honoured(
        "REDIS_PERSECOND_AUTH",
        "the password in --redis-per-second-url",
        redis::per_second,
    ),
    honoured(
        "REDIS_PERSECOND_TLS",
        "rediss:// in --redis-per-second-url",
        redis::per_second,
    ),
    honoured(
        "REDIS_SENTINEL_AUTH",
        "the sentinels' password (REDIS_TYPE=sentinel; REDIS_AUTH is then the master's, --redis-master-auth)",
        redis::main_pool,
    ),
    no_effect(
        "REDIS_PERSECOND_SENTINEL_AUTH",
        "read only with REDIS_PERSECOND_TYPE=sentinel, which Tollgate refuses",
    ),
    no_effect("REDIS_PERSECOND_PIPELINE_WINDOW", POOLS),
    no_effect("REDIS_PERSECOND_PIPELINE_LIMIT", POOLS),
    no_effect("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", POOLS),
    refused(
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        FALSE,
        "Tollgate stays ready while Redis is down and answers from failure modes; --on-store-error unavailable fails health instead",
    ),
    honoured("REDIS_TIMEOUT", "--redis-timeout", redis::redis_timeout),
    no_effect(
        "REDIS_PERSECOND_TIMEOUT",
        "the per-second pool has the main pool's --redis-timeout",
    ),
    no_effect("REDIS_POOL_ON_EMPTY_BEHAVIOR", POOLS),
    no_effect("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", POOLS),
    no_effect(
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "Tollgate starts while Redis is down (answering from failure modes) and reconnects by itself",
    ),
    no_effect(
        "REDIS_STARTUP_MAX_INTERVAL",
        "Tollgate starts while Redis is down (answering from failure modes) and reconnects by itself",
    ),
    no_effect(
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "Tollgate starts while Redis is down (answering from failure modes) and reconnects by itself",
    ),
    no_effect("MEMCACHE_HOST_PORT", MEMCACHE),
    no_effect("MEMCACHE_MAX_IDLE_CONNS", MEMCACHE),
    no_effect("MEMCACHE_SRV", MEMCACHE),
    no_effect("MEMCACHE_SRV_REFRESH", MEMCACHE),
    no_effect("MEMCACHE_TLS", MEMCACHE),
    no_effect("MEMCACHE_TLS_CLIENT_CERT", MEMCACHE),
    no_effect("MEMCACHE_TLS_CLIENT_KEY", MEMCACHE),
    no_effect("MEMCACHE_TLS_CACERT", MEMCACHE),
    no_effect("MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", MEMCACHE),
    honoured("SHADOW_MODE", "--shadow-mode", limiter::shadow_mode),
    honoured("QUOTA_MODE", "--quota-mode", limiter::quota_mode),
    refused(
        "RESPONSE_DYNAMIC_METADATA",
        FALSE,
        "descriptor metadata in the response's dynamic metadata is not supported by Tollgate yet",
    ),
    honoured(
        "MERGE_DOMAIN_CONFIG",
        "--merge-domains",
        limiter::merge_domains,
    ),
    honoured(
        "TRACING_ENABLED",
        "--tracing on: an OTLP span per ShouldRateLimit call (the endpoint from OTEL_EXPORTER_OTLP_ENDPOINT)",
        stats::tracing,
    ),
    honoured(
        "TRACING_SERVICE_NAME",
        "--tracing-service-name (default RateLimit, as the reference)",
        stats::tracing,
    ),
    honoured(
        "TRACING_SERVICE_NAMESPACE",
        "--tracing-service-namespace",
        stats::tracing,
    ),
    honoured(
        "TRACING_SERVICE_INSTANCE_ID",
        "--tracing-service-instance-id",
        stats::tracing,
    ),
    honoured(
        "TRACING_EXPORTER_PROTOCOL",
        "--tracing-protocol (http or grpc)",
        stats::tracing,
    ),
    honoured(
        "TRACING_SAMPLING_RATE",
        "--tracing-sampling-rate",
        stats::tracing,
    ),
];

/// Variables Envoy Gateway sets that the reference itself does not read
/// (the tests check each is accepted and documented).
#[cfg(test)]
pub(crate) const GATEWAY_ONLY_VARS: &[ReferenceVar] = &[no_effect(
    "GRPC_SERVER_TLS_CA_CERT",
    "Envoy Gateway sets it but the reference does not read it (it serves TLS without client certificates unless GRPC_CLIENT_TLS_CACERT is set); Tollgate does the same",
)];
