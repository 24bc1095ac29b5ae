use super::refused_vars;
use super::table::*;
use crate::settings::ServeArgs;

/// The README's table of every variable: name, and what Tollgate does.
fn markdown_table() -> String {
    let mut out = String::from("| reference variable | Tollgate |\n|---|---|\n");
    for var in REFERENCE_VARS.iter().chain(GATEWAY_ONLY_VARS) {
        let what = match var.handling {
            Handling::Honoured { setting, .. } => format!("honoured: {setting}"),
            Handling::NoEffect(why) => format!("no effect: {why}"),
            Handling::Refused { harmless: [], why } => {
                format!("refused when set: {why}")
            }
            Handling::Refused { harmless, why } => format!(
                "refused unless {}: {why}",
                harmless
                    .iter()
                    .map(|h| format!("`{h}`"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        };
        out.push_str(&format!("| `{}` | {what} |\n", var.name));
    }
    out
}

/// The names in envoyproxy/ratelimit's `src/settings/settings.go`
/// (commit f2fb157), in its order.
const SETTINGS_GO: &str = "PROTO HOST PORT DEBUG_HOST DEBUG_PORT GRPC_UDS GRPC_HOST GRPC_PORT \
    GRPC_MAX_CONNECTION_AGE GRPC_MAX_CONNECTION_AGE_GRACE GRPC_SERVER_USE_TLS GRPC_SERVER_TLS_CERT \
    GRPC_SERVER_TLS_KEY GRPC_CLIENT_TLS_CACERT GRPC_CLIENT_TLS_SAN LOG_LEVEL LOG_FORMAT CONFIG_TYPE \
    FORCE_START_WITHOUT_INITIAL_CONFIG CONFIG_GRPC_XDS_NODE_ID CONFIG_GRPC_XDS_NODE_METADATA \
    CONFIG_GRPC_XDS_SERVER_URL CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL \
    CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS CONFIG_GRPC_XDS_SERVER_USE_TLS \
    CONFIG_GRPC_XDS_CLIENT_TLS_CERT CONFIG_GRPC_XDS_CLIENT_TLS_KEY CONFIG_GRPC_XDS_SERVER_TLS_CACERT \
    CONFIG_GRPC_XDS_SERVER_TLS_SAN XDS_CLIENT_BACKOFF_INITIAL_INTERVAL XDS_CLIENT_BACKOFF_MAX_INTERVAL \
    XDS_CLIENT_BACKOFF_RANDOM_FACTOR XDS_CLIENT_BACKOFF_JITTER XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES \
    USE_DOG_STATSD USE_DOG_STATSD_MOGRIFIERS USE_STATSD STATSD_HOST STATSD_PORT EXTRA_TAGS \
    STATS_FLUSH_INTERVAL DISABLE_STATS USE_PROMETHEUS PROMETHEUS_ADDR PROMETHEUS_PATH \
    PROMETHEUS_MAPPER_YAML PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS RUNTIME_ROOT RUNTIME_SUBDIRECTORY \
    RUNTIME_APPDIRECTORY RUNTIME_IGNOREDOTFILES RUNTIME_WATCH_ROOT EXPIRATION_JITTER_MAX_SECONDS \
    LOCAL_CACHE_SIZE_IN_BYTES NEAR_LIMIT_RATIO CACHE_KEY_PREFIX BACKEND_TYPE \
    STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT LIMIT_RESPONSE_HEADERS_ENABLED LIMIT_LIMIT_HEADER \
    LIMIT_REMAINING_HEADER LIMIT_RESET_HEADER HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED \
    REDIS_SOCKET_TYPE REDIS_TYPE REDIS_URL REDIS_POOL_SIZE REDIS_AUTH REDIS_TLS REDIS_TLS_CLIENT_CERT \
    REDIS_TLS_CLIENT_KEY REDIS_TLS_CACERT REDIS_TLS_SKIP_HOSTNAME_VERIFICATION REDIS_PIPELINE_WINDOW \
    REDIS_PIPELINE_LIMIT REDIS_CLUSTER_PIPELINE_PARALLELISM REDIS_PERSECOND REDIS_PERSECOND_SOCKET_TYPE \
    REDIS_PERSECOND_TYPE REDIS_PERSECOND_URL REDIS_PERSECOND_POOL_SIZE REDIS_PERSECOND_AUTH \
    REDIS_PERSECOND_TLS REDIS_SENTINEL_AUTH REDIS_PERSECOND_SENTINEL_AUTH REDIS_PERSECOND_PIPELINE_WINDOW \
    REDIS_PERSECOND_PIPELINE_LIMIT REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM \
    REDIS_HEALTH_CHECK_ACTIVE_CONNECTION REDIS_TIMEOUT REDIS_PERSECOND_TIMEOUT \
    REDIS_POOL_ON_EMPTY_BEHAVIOR REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR REDIS_STARTUP_INITIAL_INTERVAL \
    REDIS_STARTUP_MAX_INTERVAL REDIS_STARTUP_MAX_ELAPSED_TIME MEMCACHE_HOST_PORT MEMCACHE_MAX_IDLE_CONNS \
    MEMCACHE_SRV MEMCACHE_SRV_REFRESH MEMCACHE_TLS MEMCACHE_TLS_CLIENT_CERT MEMCACHE_TLS_CLIENT_KEY \
    MEMCACHE_TLS_CACERT MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION SHADOW_MODE QUOTA_MODE \
    RESPONSE_DYNAMIC_METADATA MERGE_DOMAIN_CONFIG TRACING_ENABLED TRACING_SERVICE_NAME \
    TRACING_SERVICE_NAMESPACE TRACING_SERVICE_INSTANCE_ID TRACING_EXPORTER_PROTOCOL TRACING_SAMPLING_RATE";

#[test]
fn every_variable_of_the_reference_has_exactly_one_entry() {
    let names: Vec<&str> = REFERENCE_VARS.iter().map(|v| v.name).collect();
    let reference: Vec<&str> = SETTINGS_GO.split_whitespace().collect();
    assert_eq!(names, reference);
}

#[test]
fn the_compatibility_page_lists_every_variable_as_the_code_handles_it() {
    let page = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/compatibility.md"),
    )
    .expect("docs/compatibility.md");
    let table = markdown_table();
    assert!(
        page.contains(&table),
        "docs/compatibility.md's reference variable table is not the code's; put this in it:\n{table}"
    );
}

#[test]
fn refused_values_are_named_with_their_reason_and_harmless_ones_pass() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    let quiet = env(&[
        ("USE_STATSD", "true"),
        ("CONFIG_TYPE", "FILE"),
        ("PROTO", "tcp"),
        ("GRPC_UDS", ""),
        ("REDIS_POOL_SIZE", "10"),
    ]);
    assert_eq!(refused_vars(&quiet), Ok(()));
    let loud = env(&[
        ("USE_DOG_STATSD_MOGRIFIERS", "x"),
        ("GRPC_UDS", "/tmp/rl.sock"),
        ("RESPONSE_DYNAMIC_METADATA", "true"),
    ]);
    let error = refused_vars(&loud).expect_err("refused");
    for name in [
        "USE_DOG_STATSD_MOGRIFIERS=x",
        "GRPC_UDS=/tmp/rl.sock",
        "RESPONSE_DYNAMIC_METADATA=true",
    ] {
        assert!(error.contains(name), "{error}");
    }
}

/// `tollgate serve ARGV` with these variables, as start-up reads them.
fn serve(argv: &[&str], env: &[(&str, &str)]) -> Result<ServeArgs, String> {
    let argv = ["tollgate", "serve"].iter().chain(argv).copied();
    crate::settings::load::serve_args(argv, env)
}

#[test]
fn variables_read_together_give_one_setting_whichever_is_met_first() {
    let args = serve(
        &[],
        &[
            ("REDIS_SENTINEL_AUTH", "s3cret"),
            ("REDIS_AUTH", "m4ster"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,10.0.0.1:26379,10.0.0.2:26379"),
            ("GRPC_HOST", "127.0.0.2"),
            ("GRPC_PORT", "9001"),
            ("DEBUG_PORT", "6071"),
        ],
    )
    .expect("loads");
    assert_eq!(args.store, crate::settings::StoreKind::RedisSentinel);
    assert_eq!(args.redis_sentinel_master.as_deref(), Some("mymaster"));
    assert_eq!(
        args.redis_url.expose(),
        "redis://:s3cret@10.0.0.1:26379,redis://:s3cret@10.0.0.2:26379"
    );
    assert_eq!(args.grpc_addr.to_string(), "127.0.0.2:9001");
    assert_eq!(
        args.admin_addr
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["0.0.0.0:6071"]
    );
}

#[test]
fn a_contradiction_names_the_flag_as_it_is_spelt_and_empty_is_unset() {
    let e = serve(
        &["--xds-header", "a=b"],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x:y"),
        ],
    )
    .expect_err("contradicts");
    assert!(
        e.contains("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS (envoyproxy/ratelimit's setting) contradicts --xds-header"),
        "{e}"
    );
    let args = serve(&[], &[("LOG_FORMAT", " "), ("NEAR_LIMIT_RATIO", "")]).expect("loads");
    assert_eq!(args.log_format, crate::settings::LogFormat::Text);
    let e = serve(&[], &[("NEAR_LIMIT_RATIO", "1.5")]).expect_err("out of range");
    assert!(e.contains("near limit ratio 1.5"), "{e}");
    let e = serve(&[], &[("REDIS_TYPE", "cluster")]).expect_err("no URL");
    assert!(e.contains("REDIS_TYPE is set without REDIS_URL"), "{e}");
}
