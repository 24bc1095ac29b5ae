//! From settings to a running server: load the rules, build the store and
//! the limiter, bind the listeners, and run.

use std::sync::Arc;

use crate::candidate::Candidate;
use crate::clock::SystemClock;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::reload::Reloader;
use crate::rlqs::Quotas;
use crate::rules::{load_paths, load_sources};
use crate::server::{CandidateRules, HotReload};
use crate::settings::{OnOff, ServeArgs, StoreOptions};
use crate::store::durable::Opened;
use crate::store::redis::RedisStore;
use crate::store::{Store, StoreError};

/// Starts Tollgate as `args` say and serves until SIGINT or SIGTERM. The error
/// says what stopped start-up (or the server).
pub(crate) fn serve_from_settings(args: &ServeArgs) -> Result<(), String> {
    let (serve, otel) = prepare(args)?;
    let limiter = serve.limiter.clone();
    let served = super::run(serve, super::shutdown_signal()).map_err(|e| e.to_string());
    // Decisions have stopped: the data directory's last flush.
    let persistence = limiter.store().as_memory().and_then(|m| m.persistence());
    let saved = persistence.map_or(Ok(()), |p| p.close());
    let served = served.and(saved);
    // Spans still buffered are sent before the process ends.
    if let Some(otel) = otel.and_then(|o| Arc::try_unwrap(o).ok()) {
        otel.shutdown();
    }
    served
}

/// Everything `args` ask for, built and bound, ready to run; and the
/// tracing exporter to flush at the end. The error says what stopped
/// start-up. Wiring only: each part is made by its own function, or by
/// the settings' conversions (`ServeArgs::limiter_options`, ...).
pub(crate) fn prepare(
    args: &ServeArgs,
) -> Result<(super::Serve, Option<Arc<crate::otel::Otel>>), String> {
    // The process's metrics, made here and handed to what records them.
    let metrics = Arc::new(Metrics::new(args.max_metric_series, args.max_label_bytes));
    let xds = args.xds.options(args.load_options())?;
    let rules = initial_rules(args, xds.as_ref())?;
    let (store, data) =
        build_store(args, &rules, xds.is_some()).map_err(|e| format!("{e}; not starting"))?;
    let options = args.limiter_options();
    let clock = Arc::new(SystemClock);
    let limiter = Arc::new(Limiter::with_metrics(
        rules,
        store,
        clock.clone(),
        options,
        metrics.clone(),
    ));
    if let Some(data) = data {
        data.start(
            limiter.clone(),
            |l| l.store().as_memory(),
            |l| l.clock().now(),
        )?;
    }
    let tls = tls(args)?;
    let (grpc, admin) = listeners(args)?;
    let reference_metrics = reference_metrics(args)?;
    let otel = otel(args)?;
    // Rules from xDS are counted as they arrive; the empty set before them
    // is not a load.
    let reloader = xds.is_none().then(|| HotReload {
        reloader: Arc::new(Reloader::new(
            args.rule_paths(),
            args.load_options(),
            limiter.clone(),
        )),
        interval: (args.watch_rules == OnOff::On).then_some(args.watch_interval),
    });
    // This process's one name among the instances sharing the store.
    let instance = instance_name();
    let quotas = Arc::new(Quotas::new(
        crate::rlqs::Handles::of(&limiter),
        args.rlqs
            .quota_options(args.max_entries, args.max_value_bytes, instance.clone()),
    ));
    let candidate = candidate_rules(args)?;
    let admin_access = admin_access(args)?;
    let limited = args
        .limited
        .options()
        .map(|options| Arc::new(crate::limited::Limited::new(options, clock).named(instance)));
    let serve = super::Serve {
        limiter,
        quotas,
        candidate,
        limited,
        grpc,
        admin,
        reloader,
        xds,
        shutdown_delay: args.shutdown_delay,
        limits: super::ConnectionLimits::from_settings(args, &metrics.connections),
        tls,
        admin_tls: args.admin_tls == OnOff::On,
        log_json: args.log_json(),
        admin_access: Arc::new(admin_access),
        statsd: args.stats.statsd_options(),
        reference_metrics,
        otel: otel.clone(),
    };
    Ok((serve, otel))
}

/// The rules to start with: from the rule paths, or none until xDS sends
/// them (the server checked first).
fn initial_rules(
    args: &ServeArgs,
    xds: Option<&crate::xds::XdsOptions>,
) -> Result<crate::rules::RuleSet, String> {
    if let Some(xds) = xds {
        crate::xds::check(xds).map_err(|e| format!("{e}; not starting"))?;
        tracing::info!(server = %xds.addr, node = %xds.node_id, "rules from xDS");
        return load_sources(&[], &args.load_options()).map_err(|e| e.to_string());
    }
    let paths = args.rule_paths();
    let rules = load_paths(&paths, &args.load_options()).map_err(|errors| {
        // The default is relative to the working directory: outside the
        // checkout it does not exist, and the error alone does not say why
        // Tollgate looked there.
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
        format!(
            "rules not loaded ({} error(s)); not starting\n{errors}{hint}",
            errors.0.len()
        )
    })?;
    tracing::info!(
        rules = rules.rules().len(),
        domains = rules.domain_count(),
        paths = ?paths,
        "rules loaded"
    );
    Ok(rules)
}

/// TLS for the listeners, when --tls-cert and --tls-key are given.
fn tls(args: &ServeArgs) -> Result<Option<Arc<super::Tls>>, String> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    let files = super::TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: args.tls_client_ca.clone(),
        client_san: args.tls_client_san.clone(),
    };
    let tls = super::Tls::load(files).map_err(|e| format!("TLS not loaded: {e}; not starting"))?;
    tracing::info!(
        cert = %cert.display(),
        client_certificates = args.tls_client_ca.is_some(),
        "serving gRPC and admin HTTP over TLS"
    );
    Ok(Some(Arc::new(tls)))
}

/// Why a listener could not be bound, naming the flag that chose the
/// address: what an operator changes.
fn cannot_listen(addr: std::net::SocketAddr, what: &str, flag: &str, e: &std::io::Error) -> String {
    let why = match e.kind() {
        std::io::ErrorKind::AddrInUse => {
            "the address is already in use (another process, perhaps another tollgate, listens on it)"
                .to_owned()
        }
        std::io::ErrorKind::PermissionDenied => {
            "permission denied (ports below 1024 need privileges)".to_owned()
        }
        std::io::ErrorKind::AddrNotAvailable => {
            "no interface of this machine has that address".to_owned()
        }
        _ => e.to_string(),
    };
    format!("cannot listen on {addr} for {what} ({flag}): {why}; choose another with {flag}")
}

/// The gRPC listeners (one per worker) and the admin listeners, bound.
fn listeners(
    args: &ServeArgs,
) -> Result<(Vec<std::net::TcpListener>, Vec<std::net::TcpListener>), String> {
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let grpc = super::bind_grpc(args.grpc_addr, workers)
        .map_err(|e| cannot_listen(args.grpc_addr, "gRPC", "--grpc-addr", &e))?;
    let mut admin = Vec::new();
    for addr in &args.admin_addr {
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| cannot_listen(*addr, "admin HTTP", "--admin-addr", &e))?;
        admin.push(listener);
    }
    if let Some(addr) = grpc.first().and_then(|l| l.local_addr().ok()) {
        tracing::info!(%addr, workers, "gRPC listening");
    }
    Ok((grpc, admin))
}

/// The OTLP exporter, when tracing is on.
fn otel(args: &ServeArgs) -> Result<Option<Arc<crate::otel::Otel>>, String> {
    let Some(options) = args.otel.options() else {
        return Ok(None);
    };
    let otel = crate::otel::Otel::start(&options)
        .map_err(|e| format!("tracing not started: {e}; not starting"))?;
    tracing::info!(
        endpoint = options.endpoint.as_deref().unwrap_or("OTEL_EXPORTER_OTLP_ENDPOINT or the default"),
        protocol = ?options.protocol,
        sampling_rate = options.sampling_rate,
        "tracing ShouldRateLimit calls (OTLP)"
    );
    Ok(Some(Arc::new(otel)))
}

/// The candidate rules beside the live ones, with their reloader.
fn candidate_rules(args: &ServeArgs) -> Result<Option<CandidateRules>, String> {
    if args.candidate_rules.is_empty() {
        return Ok(None);
    }
    let rules = load_paths(&args.candidate_rules, &args.load_options()).map_err(|errors| {
        format!(
            "candidate rules not loaded ({} error(s)); not starting\n{errors}",
            errors.0.len()
        )
    })?;
    tracing::info!(rules = rules.rules().len(), paths = ?args.candidate_rules, "candidate rules loaded");
    // Bounded as the live memory store is (its own keys count apart).
    let candidate = Arc::new(Candidate::new(
        rules,
        Arc::new(SystemClock),
        args.limiter_options(),
        args.memory_options(),
    ));
    let reloader = Arc::new(Reloader::new(
        args.candidate_rules.clone(),
        args.load_options(),
        candidate.limiter().clone(),
    ));
    Ok(Some(CandidateRules {
        candidate,
        reloader,
    }))
}

/// Who may do what on the admin port: host names, `/json`, tokens.
fn admin_access(args: &ServeArgs) -> Result<crate::admin::Access, String> {
    let mut access = crate::admin::Access::new(
        args.admin_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect(),
        args.admin_json == OnOff::On,
    )
    .with_reset_ceiling(args.limited.admin_reset_max_keys)
    .with_failure_limits(args.limited.failure_limits());
    if let Some(path) = &args.limited.admin_token_file {
        let mode_check = args.limited.admin_token_file_mode_check == OnOff::On;
        access = access.with_tokens(crate::admin::TokenFile::load(path, mode_check)?);
    }
    if args.limited.admin_reads == crate::settings::AdminReads::Token {
        if args.limited.admin_token_file.is_none() {
            return Err("--admin-reads token needs --admin-token-file (the tokens that may read); not starting".into());
        }
        access = access.with_token_reads();
    }
    Ok(access)
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
        .map_err(|e| cannot_listen(addr, "reference metrics", "--reference-metrics-addr", &e))?;
    tracing::info!(%addr, %path, "reference metrics listening");
    Ok(Some(super::ReferenceMetrics {
        listener,
        path,
        mapper: Arc::new(mapper),
    }))
}

/// The store the settings ask for; a Redis store is probed once (a Redis
/// down at start is an outage like any other: Tollgate starts and answers
/// from the failure modes).
fn build_store(
    args: &ServeArgs,
    rules: &crate::rules::RuleSet,
    xds: bool,
) -> Result<(Store, Option<Opened>), StoreError> {
    let options = match args.store_options().map_err(StoreError::Config)? {
        StoreOptions::Memory(options) => match args.data.options() {
            None => return Ok((Store::memory(options), None)),
            Some(data) => {
                let keep = kept_scopes(rules, xds);
                let now = crate::clock::Clock::now(&SystemClock);
                let (store, opened) = crate::store::durable::open(&data, options, &keep, now)
                    .map_err(StoreError::Config)?;
                return Ok((Store::Memory(store), Some(opened)));
            }
        },
        StoreOptions::Redis(options) => *options,
    };
    // `rediss://` connections need a process-wide TLS crypto provider; the
    // redis crate does not choose one. (An error means one is installed.)
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(url) = &args.redis_per_second_url {
        tracing::info!(url = %url, "limits of one second go to their own Redis");
    }
    let store = RedisStore::new(options)?;
    // On a thread of its own, with a runtime of its own: start-up may run
    // inside a runtime (the in-process harness), where blocking on another
    // is refused.
    let probe = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| StoreError::Config(e.to_string()))
                    .map(|runtime| runtime.block_on(store.probe()))
            })
            .join()
            .unwrap_or_else(|_| {
                Err(StoreError::Config(
                    "the Redis probe's thread panicked".into(),
                ))
            })
    })?;
    match probe {
        Ok(()) => tracing::info!(url = %args.redis_url, "Redis answers"),
        Err(e @ StoreError::Config(_)) => tracing::error!(
            url = %args.redis_url,
            error = %e,
            "Redis refuses this configuration: answering from failure modes and not ready until it is fixed"
        ),
        Err(e) => tracing::warn!(url = %args.redis_url, error = %e, "Redis does not answer yet"),
    }
    Ok((Store::Redis(store), None))
}

/// Which saved counters a restart keeps: those of the rules in force (by
/// their owner tags, which a changed limit keeps, as a reload does) and the
/// limits that requests of a known domain bring; all of them when the rules
/// come from xDS, which has sent none yet.
fn kept_scopes(rules: &crate::rules::RuleSet, xds: bool) -> impl Fn(u64) -> bool {
    use crate::store::scope_tag;
    let mut tags: std::collections::HashSet<u64> = std::collections::HashSet::new();
    for rule in rules.rules() {
        tags.insert(scope_tag(&rule.domain, Some(&rule.path)));
        tags.insert(scope_tag(&rule.domain, None));
    }
    move |tag| xds || tags.contains(&tag)
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
