//! The `tollgate` binary: parse settings, start logging, run.

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use tollgate::rules::load_paths;
use tollgate::settings::{CheckArgs, Cli, Command, LogFormat, ServeArgs, unknown_env};

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
            if let Err(e) = args.apply_reference_env(&|name| std::env::var(name).ok(), &explicit) {
                eprintln!("tollgate: {e}; not starting");
                return ExitCode::FAILURE;
            }
            serve(*args)
        }
        Command::Check(args) => check(args),
        Command::Simulate(args) => {
            let simulation = args.simulation();
            match tollgate::simulate::main(
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
    match tollgate::server::start(&args) {
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
