//! The `tollgate` binary: parse settings, start logging, run.

use std::process::ExitCode;
use std::sync::Arc;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use tollgate::clock::SystemClock;
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::reload::Reloader;
use tollgate::rules::load_paths;
use tollgate::settings::{
    CheckArgs, Cli, Command, KNOWN_ENV, LogFormat, OnOff, OnStoreError, ServeArgs, StoreKind,
};
use tollgate::store::redis::{RedisOptions, RedisStore, RedisTarget};
use tollgate::store::{MemoryStore, MemoryStoreOptions, Store, StoreError};

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Serve(mut args) => {
            let serve_matches = matches.subcommand_matches("serve");
            let explicit = |id: &str| {
                serve_matches
                    .and_then(|m| m.value_source(id))
                    .is_some_and(|s| s != ValueSource::DefaultValue)
            };
            let unknown: Vec<String> = std::env::vars()
                .map(|(k, _)| k)
                .filter(|k| k.starts_with("TOLLGATE_") && !KNOWN_ENV.contains(&k.as_str()))
                .collect();
            if !unknown.is_empty() {
                eprintln!(
                    "tollgate: unknown setting(s) {}; not starting (see `tollgate serve --help`)",
                    unknown.join(", ")
                );
                return ExitCode::FAILURE;
            }
            if let Err(e) = args.apply_reference_env(&|name| std::env::var(name).ok(), &explicit) {
                eprintln!("tollgate: {e}; not starting");
                return ExitCode::FAILURE;
            }
            serve(*args)
        }
        Command::Check(args) => check(args),
    }
}

fn check(args: CheckArgs) -> ExitCode {
    match load_paths(&args.paths, &args.load_options()) {
        Ok(rules) => {
            print!("{rules}");
            println!(
                "ok: {} rules in {} domains",
                rules.rules().len(),
                rules.domain_count()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!("{} error(s); nothing loaded", errors.0.len());
            ExitCode::FAILURE
        }
    }
}

fn build_store(args: &ServeArgs) -> Result<Store, StoreError> {
    let target = match args.store {
        StoreKind::Memory => {
            return Ok(Store::Memory(MemoryStore::new(MemoryStoreOptions {
                max_keys: args.max_keys,
                ..MemoryStoreOptions::default()
            })));
        }
        StoreKind::Redis => RedisTarget::Standalone(args.redis_url.clone()),
        StoreKind::RedisCluster => RedisTarget::Cluster(
            args.redis_url
                .split(',')
                .map(|s| s.trim().to_owned())
                .collect(),
        ),
    };
    let mut options = RedisOptions::new(target);
    options.timeout = args.redis_timeout;
    options.prefix = args.redis_prefix.clone();
    options.breaker_threshold = args.redis_breaker.max(1);
    options.over_limit_cache = args.over_limit_cache == OnOff::On;
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
        Err(e) => tracing::warn!(url = %args.redis_url, error = %e, "Redis does not answer yet"),
    }
    Ok(Store::Redis(store))
}

fn serve(args: ServeArgs) -> ExitCode {
    let filter = match tracing_subscriber::EnvFilter::try_new(&args.log_level) {
        Ok(filter) => filter,
        Err(e) => {
            eprintln!(
                "tollgate: invalid log level '{}': {e}; not starting",
                args.log_level
            );
            return ExitCode::FAILURE;
        }
    };
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match args.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }

    let paths = args.rule_paths();
    let rules = match load_paths(&paths, &args.load_options()) {
        Ok(rules) => rules,
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!(
                "tollgate: rules not loaded ({} error(s)); not starting",
                errors.0.len()
            );
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        rules = rules.rules().len(),
        domains = rules.domain_count(),
        paths = ?paths,
        "rules loaded"
    );
    let store = match build_store(&args) {
        Ok(store) => store,
        Err(e) => {
            eprintln!("tollgate: {e}; not starting");
            return ExitCode::FAILURE;
        }
    };
    let options = LimiterOptions {
        failure_mode: args.failure_mode.into(),
        response_headers: args.response_headers == OnOff::On,
        default_algorithm: args.default_algorithm.into(),
        unavailable_on_store_error: args.on_store_error == OnStoreError::Unavailable,
        instances: args.instances,
        shadow_mode: args.shadow_mode,
        near_limit_ratio: args.near_limit_ratio,
    };
    let limiter = Arc::new(Limiter::new(rules, store, Arc::new(SystemClock), options));
    let workers = args
        .workers
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let listeners = match tollgate::server::bind_grpc(args.grpc_addr, workers) {
        Ok(listeners) => listeners,
        Err(e) => {
            eprintln!("tollgate: cannot listen on {}: {e}", args.grpc_addr);
            return ExitCode::FAILURE;
        }
    };
    let mut admin = Vec::new();
    for addr in &args.admin_addr {
        match std::net::TcpListener::bind(addr).and_then(|l| l.set_nonblocking(true).map(|()| l)) {
            Ok(listener) => admin.push(listener),
            Err(e) => {
                eprintln!("tollgate: cannot listen on {addr} (admin HTTP): {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(addr) = listeners.first().and_then(|l| l.local_addr().ok()) {
        // Lines on stdout that scripts and tests can wait for.
        for a in admin.iter().filter_map(|l| l.local_addr().ok()) {
            println!("tollgate: admin listening on {a}");
        }
        println!("tollgate: gRPC listening on {addr}");
        tracing::info!(%addr, workers, "gRPC listening");
    }
    let reloader = Arc::new(Reloader::new(paths, args.load_options(), limiter.clone()));
    let watch = (args.watch_rules == OnOff::On).then_some(args.watch_interval);
    let serve = tollgate::server::Serve {
        limiter,
        grpc: listeners,
        admin,
        reloader: Some((reloader, watch)),
        shutdown_delay: args.shutdown_delay,
    };
    match tollgate::server::run(serve, tollgate::server::shutdown_signal()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e}");
            ExitCode::FAILURE
        }
    }
}

// glibc's malloc showed up at ~10% of a request's CPU time; mimalloc's
// per-thread free lists suit one runtime per core.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
