//! The `tollgate` binary: parse settings, start logging, run.

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use tollgate::rules::load_paths;
use tollgate::{CheckArgs, Cli, Command, LogFormat, REFERENCE_PROGRAM, ServeArgs, unknown_env};

fn main() -> ExitCode {
    // Run as `ratelimit` (Envoy Gateway's `/bin/ratelimit`, a link to this
    // binary), it is the reference's binary: `serve`, configured by the
    // reference's defaults and variables.
    let as_reference = std::env::args_os()
        .next()
        .and_then(|arg0| {
            std::path::Path::new(&arg0)
                .file_name()
                .map(|n| n == REFERENCE_PROGRAM)
        })
        .unwrap_or(false);
    let matches = if as_reference {
        if std::env::args_os().len() > 1 {
            eprintln!(
                "{REFERENCE_PROGRAM}: takes no arguments (it is configured by envoyproxy/ratelimit's \
                 environment variables); run `tollgate serve --help` for Tollgate's flags"
            );
            return ExitCode::FAILURE;
        }
        Cli::command().get_matches_from(["tollgate", "serve"])
    } else {
        Cli::command().get_matches()
    };
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
            let vars: Vec<(String, String)> = std::env::vars_os()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.to_string_lossy().into_owned(),
                    )
                })
                .collect();
            let unknown = unknown_env(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            if !unknown.is_empty() {
                eprintln!(
                    "tollgate: unknown setting(s) {}; not starting (see `tollgate serve --help`)",
                    unknown.join(", ")
                );
                return ExitCode::FAILURE;
            }
            if as_reference {
                args.reference_defaults(&explicit);
            }
            if let Err(e) = args.apply_reference_env(&|name| std::env::var(name).ok(), &explicit) {
                eprintln!("tollgate: {e}; not starting");
                return ExitCode::FAILURE;
            }
            serve(*args)
        }
        Command::Check(args) => check(args),
        Command::Top(args) => match args.options().and_then(|o| tollgate::run_top(&o)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate top: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Simulate(args) => {
            let simulation = args.simulation();
            match tollgate::run_simulate(
                &simulation,
                args.out.as_deref(),
                args.save_traffic.as_deref(),
            ) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("tollgate simulate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn check(args: CheckArgs) -> ExitCode {
    match load_paths(&args.paths, &args.load_options()) {
        // What `serve` would refuse to be ready with (see Health::check).
        Ok(rules) if rules.domain_count() == 0 => {
            eprintln!(
                "no rules in {}: `tollgate serve` would start but not be ready (\"no rules loaded\")",
                args.paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            ExitCode::FAILURE
        }
        Ok(rules) => {
            use std::io::Write;
            // Envoy's RateLimitResponse has a unit and no multiplier: for a
            // window of several units, Envoy's x-ratelimit headers state the
            // base unit's window (Tollgate's own RateLimit-Policy is exact).
            for rule in rules.rules() {
                if let Some(limit) = rule.limit.filter(|l| l.unit_multiplier > 1) {
                    let unit = limit.unit.period_name(1, None);
                    eprintln!(
                        "warning: {} ({}): a window of {} {unit}s is sent to Envoy as per {unit} (Envoy's RateLimit has no multiplier), so Envoy's x-ratelimit-limit says w={} where the window is {} s; Tollgate's RateLimit-Policy header says the truth",
                        rule.path,
                        rule.reported_name,
                        limit.unit_multiplier,
                        limit.period_seconds() / u64::from(limit.unit_multiplier),
                        limit.period_seconds(),
                    );
                }
            }
            if !args.against.is_empty() {
                match load_paths(&args.against, &args.load_options()) {
                    Ok(old) => {
                        for change in tollgate::rules::restarted_counters(&old, &rules) {
                            eprintln!("warning: {change}");
                        }
                    }
                    Err(errors) => {
                        eprintln!("{errors}");
                        eprintln!("the rules given with --against do not load");
                        return ExitCode::FAILURE;
                    }
                }
            }
            let mut out = std::io::stdout().lock();
            let written = write!(out, "{rules}")
                .and_then(|()| {
                    writeln!(
                        out,
                        "ok: {} rules in {} domains",
                        rules.rules().len(),
                        rules.domain_count()
                    )
                })
                .and_then(|()| out.flush());
            match written {
                // `tollgate check ... | head -1`: the reader has all it
                // wanted.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("tollgate check: cannot write the result: {e}");
                    ExitCode::FAILURE
                }
                Ok(()) => ExitCode::SUCCESS,
            }
        }
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!("{} error(s); nothing loaded", errors.0.len());
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    if let Err(e) = tollgate::init_logging(&args.log_level, args.log_format == LogFormat::Json) {
        eprintln!("tollgate: {e}; not starting");
        return ExitCode::FAILURE;
    }
    match tollgate::serve_from_settings(&args) {
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
