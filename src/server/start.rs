//! From settings to a running server: load the rules, build the store and
//! the limiter, bind the listeners, and run.

use std::sync::Arc;

use crate::candidate::Candidate;
use crate::clock::SystemClock;
use crate::limiter::{Limiter, LimiterOptions};
use crate::reload::Reloader;
use crate::rlqs::{QuotaOptions, Quotas, Unmatched};
use crate::rules::{load_paths, load_sources};
use crate::server::{CandidateRules, HotReload};
use crate::settings::{OnOff, OnStoreError, ServeArgs, StoreKind, UnmatchedArg};
use crate::store::redis::{RedisOptions, RedisStore, RedisTarget};
use crate::store::{MemoryStore, MemoryStoreOptions, Store, StoreError};

/// Starts Tollgate as `args` say and serves until SIGINT or SIGTERM. The error
/// says what stopped start-up (or the server).
pub(crate) fn serve_from_settings(args: &ServeArgs) -> Result<(), String> {
    let (serve, otel) = prepare(args)?;
    let served = super::run(serve, super::shutdown_signal()).map_err(|e| e.to_string());
    // Spans still buffered are sent before the process ends.
    if let Some(otel) = otel.and_then(|o| Arc::try_unwrap(o).ok()) {
        otel.shutdown();
    }
    served
}

/// Everything `args` ask for, built and bound, ready to run; and the
/// tracing exporter to flush at the end. The error says what stopped
/// start-up.
pub(crate) fn prepare(
    args: &ServeArgs,
) -> Result<(super::Serve, Option<Arc<crate::otel::Otel>>), String> {
    let paths = args.rule_paths();
    let xds = args.xds.options(args.load_options())?;
    let rules = match &xds {
        // Rules arrive over the stream; until then there are none.
        Some(xds) => {
            crate::xds::check(xds).map_err(|e| format!("{e}; not starting"))?;
            tracing::info!(server = %xds.addr, node = %xds.node_id, "rules from xDS");
            load_sources(&[], &args.load_options()).map_err(|e| e.to_string())?
        }
        None => match load_paths(&paths, &args.load_options()) {
            Ok(rules) => rules,
            Err(errors) => {
                // The default is relative to the working directory: outside
                // the checkout it does not exist, and the error alone does
                // not say why Tollgate looked there.
                let hint = if args.rules.is_empty() && !paths.iter().all(|p| p.exists()) {
                    format!(
                        "\n(no --rules given: the default is {}, relative to the working directory {}; give --rules PATH)",
                        paths
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", "),
                        std::env::current_dir()
                            .map(|d| d.display().to_string())
                            .unwrap_or_else(|_| "?".into())
                    )
                } else {
                    String::new()
                };
                return Err(format!(
                    "rules not loaded ({} error(s)); not starting\n{errors}{hint}",
                    errors.0.len()
                ));
            }
        },
    };
    if xds.is_none() {
        tracing::info!(
            rules = rules.rules().len(),
            domains = rules.domain_count(),
            paths = ?paths,
            "rules loaded"
        );
    }
    let store = build_store(args).map_err(|e| format!("{e}; not starting"))?;
    let options = LimiterOptions {
        failure_mode: args.failure_mode.into(),
        response_headers: args.response_headers == OnOff::On,
        default_algorithm: args.rule_load.default_algorithm.into(),
        unavailable_on_store_error: args.on_store_error == OnStoreError::Unavailable,
        instances: args.instances,
        shadow_mode: args.shadow_mode,
        quota_mode: args.quota_mode,
        near_limit_ratio: args.near_limit_ratio,
        bounds: crate::limiter::RequestBounds {
            descriptors: args.max_descriptors,
            entries: args.max_entries,
            value_bytes: args.max_value_bytes,
            request_bytes: args.max_request_bytes,
            checks: args.max_checks,
        },
        max_metric_series: args.max_metric_series,
        max_label_bytes: args.max_label_bytes,
        refusal_log: args.limited.log_refusals.into(),
        refusal_log_rate: args.limited.refusal_log_rate,
    };
    let limiter = Arc::new(Limiter::new(rules, store, Arc::new(SystemClock), options));
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let files = super::TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
                client_san: args.tls_client_san.clone(),
            };
            let tls = super::Tls::load(files)
                .map_err(|e| format!("TLS not loaded: {e}; not starting"))?;
            tracing::info!(
                cert = %cert.display(),
                client_certificates = args.tls_client_ca.is_some(),
                "serving gRPC and admin HTTP over TLS"
            );
            Some(Arc::new(tls))
        }
        _ => None,
    };
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let listeners = super::bind_grpc(args.grpc_addr, workers)
        .map_err(|e| format!("cannot listen on {}: {e}", args.grpc_addr))?;
    let mut admin = Vec::new();
    for addr in &args.admin_addr {
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| format!("cannot listen on {addr} (admin HTTP): {e}"))?;
        admin.push(listener);
    }
    let reference_metrics = reference_metrics(args)?;
    let otel = match args.otel.options() {
        None => None,
        Some(options) => {
            let otel = crate::otel::Otel::start(&options)
                .map_err(|e| format!("tracing not started: {e}; not starting"))?;
            tracing::info!(
                endpoint = options.endpoint.as_deref().unwrap_or("OTEL_EXPORTER_OTLP_ENDPOINT or the default"),
                protocol = ?options.protocol,
                sampling_rate = options.sampling_rate,
                "tracing ShouldRateLimit calls (OTLP)"
            );
            Some(Arc::new(otel))
        }
    };
    if let Some(addr) = listeners.first().and_then(|l| l.local_addr().ok()) {
        tracing::info!(%addr, workers, "gRPC listening");
    }
    // Rules from xDS are counted as they arrive; the empty set before them
    // is not a load.
    let reloader = xds
        .is_none()
        .then(|| Arc::new(Reloader::new(paths, args.load_options(), limiter.clone())));
    let watch = (args.watch_rules == OnOff::On).then_some(args.watch_interval);
    let quotas = Arc::new(Quotas::new(
        limiter.clone(),
        QuotaOptions {
            assignment_ttl: args.rlqs.assignment_ttl,
            min_share: args.rlqs.min_share,
            unmatched: match args.rlqs.unmatched {
                UnmatchedArg::AllowAll => Unmatched::Allow,
                UnmatchedArg::DenyAll => Unmatched::Deny,
            },
            max_buckets: args.rlqs.max_buckets,
            max_streams: args.rlqs.max_streams,
            max_bucket_bytes: args.rlqs.max_bucket_bytes,
            max_buckets_per_stream: args.rlqs.max_buckets_per_stream,
            max_pairs: args.rlqs.max_pairs,
            exchange_timeout: args.rlqs.exchange_timeout,
            max_queued_bytes: args.rlqs.max_queued_bytes,
            idle_timeout: args.rlqs.idle_timeout,
            max_entries: args.max_entries,
            max_value_bytes: args.max_value_bytes,
            instance: instance_name(),
        },
    ));
    let candidate = if args.candidate_rules.is_empty() {
        None
    } else {
        let rules = load_paths(&args.candidate_rules, &args.load_options()).map_err(|errors| {
            format!(
                "candidate rules not loaded ({} error(s)); not starting\n{errors}",
                errors.0.len()
            )
        })?;
        tracing::info!(rules = rules.rules().len(), paths = ?args.candidate_rules, "candidate rules loaded");
        // Bounded as the live memory store is (its own keys count apart).
        let store = MemoryStoreOptions {
            max_keys: args.max_keys,
            ..MemoryStoreOptions::default()
        };
        let candidate = Arc::new(Candidate::new(rules, Arc::new(SystemClock), options, store));
        let reloader = Arc::new(Reloader::new(
            args.candidate_rules.clone(),
            args.load_options(),
            candidate.limiter().clone(),
        ));
        Some(CandidateRules {
            candidate,
            reloader,
        })
    };
    let mut admin_access = crate::admin::Access::new(
        args.admin_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect(),
        args.admin_json == OnOff::On,
    );
    if let Some(path) = &args.limited.admin_token_file {
        admin_access = admin_access.with_tokens(crate::admin::read_tokens(path)?);
    }
    if args.limited.admin_reads == crate::settings::AdminReads::Token {
        if args.limited.admin_token_file.is_none() {
            return Err("--admin-reads token needs --admin-token-file (the tokens that may read); not starting".into());
        }
        admin_access = admin_access.with_token_reads();
    }
    let limited = args.limited.options().map(|options| {
        Arc::new(
            crate::limited::Limited::new(options, limiter.clock().clone()).named(instance_name()),
        )
    });
    let limiter_connections = limiter.metrics().connections.clone();
    let serve = super::Serve {
        limiter,
        quotas,
        candidate,
        limited,
        grpc: listeners,
        admin,
        reloader: reloader.map(|reloader| HotReload {
            reloader,
            interval: watch,
        }),
        xds,
        shutdown_delay: args.shutdown_delay,
        limits: super::ConnectionLimits {
            grpc_connections: Arc::new(tokio::sync::Semaphore::new(args.max_connections)),
            handshake_timeout: args.handshake_timeout,
            idle_timeout: args.idle_timeout,
            keepalive: args.keepalive.0,
            request_timeout: args.request_timeout,
            max_streams: args.max_streams,
            window_bytes: args.max_request_bytes,
            admin_connections: Arc::new(tokio::sync::Semaphore::new(args.max_admin_connections)),
            admin_timeout: args.admin_timeout,
            admin_idle: super::ConnectionLimits::admin_idle(&limiter_connections),
            open: limiter_connections,
        },
        tls,
        admin_tls: args.admin_tls == OnOff::On,
        log_json: args.log_format == crate::settings::LogFormat::Json,
        admin_access: Arc::new(admin_access),
        statsd: args.stats.statsd_options(),
        reference_metrics,
        otel: otel.clone(),
    };
    Ok((serve, otel))
}

/// The reference's stats as Prometheus metrics, when asked for: the
/// mapping loaded and the listener bound, or why not.
fn reference_metrics(args: &ServeArgs) -> Result<Option<super::ReferenceMetrics>, String> {
    let Some(addr) = args.stats.reference_metrics_addr else {
        return Ok(None);
    };
    let mapper = match &args.stats.statsd_mapping {
        None => crate::stats::mapper::Mapper::default(),
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| crate::stats::mapper::Mapper::parse(&text))
            .map_err(|e| format!("statsd mapping {}: {e}; not starting", path.display()))?,
    };
    let path = args.stats.reference_metrics_path.clone();
    if !path.starts_with('/') {
        return Err(format!(
            "--reference-metrics-path {path}: must start with /"
        ));
    }
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| format!("cannot listen on {addr} (reference metrics): {e}"))?;
    tracing::info!(%addr, %path, "reference metrics listening");
    Ok(Some(super::ReferenceMetrics {
        listener,
        path,
        mapper: Arc::new(mapper),
    }))
}

fn build_store(args: &ServeArgs) -> Result<Store, StoreError> {
    // `rediss://` connections need a process-wide TLS crypto provider; the
    // redis crate does not choose one. (An error means one is installed.)
    let _ = rustls::crypto::ring::default_provider().install_default();
    let target = match args.store {
        StoreKind::Memory => {
            return Ok(Store::Memory(MemoryStore::new(MemoryStoreOptions {
                max_keys: args.max_keys,
                ..MemoryStoreOptions::default()
            })));
        }
        StoreKind::Redis => RedisTarget::Standalone(args.redis_url.expose().to_owned()),
        StoreKind::RedisSentinel => {
            let sentinels: Vec<String> = args
                .redis_url
                .expose()
                .split(',')
                .map(|s| s.trim().to_owned())
                .collect();
            let master = args.redis_sentinel_master.clone().ok_or_else(|| {
                StoreError::Config("--store redis-sentinel needs --redis-sentinel-master".into())
            })?;
            let scheme = if sentinels.iter().all(|s| s.starts_with("rediss://")) {
                "rediss"
            } else {
                "redis"
            };
            let auth = args.redis_master_auth.as_ref().map(|a| a.expose());
            RedisTarget::Sentinel {
                master,
                sentinels,
                master_prefix: crate::store::redis::url_prefix(scheme, auth),
            }
        }
        StoreKind::RedisCluster => RedisTarget::Cluster(
            args.redis_url
                .expose()
                .split(',')
                .map(|s| s.trim().to_owned())
                .collect(),
        ),
    };
    let mut options = RedisOptions::new(target);
    options.timeout = args.redis_timeout;
    options.prefix = args.redis_prefix.clone();
    options.breaker_threshold = args.redis_breaker;
    options.probe_timeout = args.redis_probe_timeout;
    options.over_limit_cache = args.over_limit_cache == OnOff::On;
    options.batch.requests = args.redis_batch as usize;
    if let Some(path) = &args.redis_tls_ca {
        let ca = std::fs::read(path)
            .map_err(|e| StoreError::Config(format!("--redis-tls-ca {}: {e}", path.display())))?;
        options.tls_ca = Some(ca);
    }
    if let (Some(cert), Some(key)) = (&args.redis_tls_cert, &args.redis_tls_key) {
        let read = |flag: &str, path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| StoreError::Config(format!("{flag} {}: {e}", path.display())))
        };
        options.tls_client = Some((
            read("--redis-tls-cert", cert)?,
            read("--redis-tls-key", key)?,
        ));
    }
    if let Some(url) = &args.redis_per_second_url {
        if args.store == StoreKind::Memory {
            return Err(StoreError::Config(
                "--redis-per-second-url needs a Redis store (--store redis, redis-cluster or redis-sentinel)".into(),
            ));
        }
        let target = match args.redis_per_second_store {
            StoreKind::Redis => RedisTarget::Standalone(url.expose().to_owned()),
            StoreKind::RedisCluster => RedisTarget::Cluster(
                url.expose()
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .collect(),
            ),
            other => {
                return Err(StoreError::Config(format!(
                    "--redis-per-second-store {other:?}: redis or redis-cluster"
                )));
            }
        };
        let mut per_second = options.clone();
        per_second.target = target;
        options.per_second = Some(Box::new(per_second));
        tracing::info!(url = %url, "limits of one second go to their own Redis");
    }
    let store = RedisStore::new(options)?;
    // Redis being down at start is an outage like any other: start, answer
    // from the failure modes, and say so.
    let probe = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::Config(e.to_string()))?
        .block_on(store.probe());
    match probe {
        Ok(()) => tracing::info!(url = %args.redis_url, "Redis answers"),
        Err(e @ StoreError::Config(_)) => tracing::error!(
            url = %args.redis_url,
            error = %e,
            "Redis refuses this configuration: answering from failure modes and not ready until it is fixed"
        ),
        Err(e) => tracing::warn!(url = %args.redis_url, error = %e, "Redis does not answer yet"),
    }
    Ok(Store::Redis(store))
}

/// This process's name among the instances sharing a store: host name,
/// process id and start time, so a restarted instance is a new one (the old
/// one's weights go stale and drop out).
fn instance_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".into());
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    format!("{host}-{}-{started}", std::process::id())
}
