//! What the `tollgate` binary runs: its settings loaded from the command
//! line and the environment ([`crate::settings::load`]), then one of the
//! subcommands.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use crate::rules::{load_paths, restarted_counters};
use crate::settings::{CheckArgs, Command, Env, LoadError, ServeArgs, load};

/// The `tollgate` binary: `argv` and `env` are the process's.
pub fn main<T: Into<OsString>>(argv: impl IntoIterator<Item = T>, env: &Env) -> ExitCode {
    let cli = match load(argv, env) {
        Ok(cli) => cli,
        Err(LoadError::Usage(e)) => {
            // --help and --version print to stdout and succeed.
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
        Err(LoadError::Refused(line)) => {
            eprintln!("{line}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Serve(args) => serve(&args),
        Command::Check(args) => check(&args),
        Command::Top(args) => match args.options().and_then(|o| crate::top::run(&o)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate top: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Simulate(args) => {
            match crate::simulate::run_cli(
                &args.simulation(),
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

fn serve(args: &ServeArgs) -> ExitCode {
    if let Err(e) = crate::logging::init(&args.log_level, args.log_json()) {
        eprintln!("tollgate: {e}; not starting");
        return ExitCode::FAILURE;
    }
    match crate::server::serve_from_settings(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `tollgate check`: the rules loaded (or every error), printed as
/// compiled, with warnings for what Envoy cannot state and for counters a
/// change would restart.
fn check(args: &CheckArgs) -> ExitCode {
    let options = args.load_options();
    let rules = match load_paths(&args.paths, &options) {
        Ok(rules) => rules,
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!("{} error(s); nothing loaded", errors.0.len());
            return ExitCode::FAILURE;
        }
    };
    // What `serve` would refuse to be ready with (see Health::check).
    if rules.domain_count() == 0 {
        eprintln!(
            "no rules in {}: `tollgate serve` would start but not be ready (\"no rules loaded\")",
            args.paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        return ExitCode::FAILURE;
    }
    for warning in rules.warnings() {
        eprintln!("warning: {warning}");
    }
    // Envoy's RateLimitResponse has a unit and no multiplier: for a window
    // of several units, Envoy's x-ratelimit headers state the base unit's
    // window (Tollgate's own RateLimit-Policy is exact).
    for rule in rules.rules() {
        // (An in-flight cap's multiplier is its longest hold, not a window.)
        if let Some(limit) = rule
            .limit
            .filter(|l| l.unit_multiplier > 1 && l.held.is_none())
        {
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
    if let Some(path) = &args.envoy_config {
        match envoy_coverage(path, &rules, args) {
            Ok(true) => {}
            Ok(false) => return ExitCode::FAILURE,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if !args.against.is_empty() {
        match load_paths(&args.against, &options) {
            Ok(old) => {
                for change in restarted_counters(&old, &rules) {
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
        // `tollgate check ... | head -1`: the reader has all it wanted.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate check: cannot write the result: {e}");
            ExitCode::FAILURE
        }
        Ok(()) => ExitCode::SUCCESS,
    }
}

/// `check --envoy-config`: prints what the cross-check found; false when a
/// finding is an error by the flags.
fn envoy_coverage(
    path: &std::path::Path,
    rules: &crate::rules::RuleSet,
    args: &CheckArgs,
) -> Result<bool, String> {
    use crate::settings::Severity;
    let filters = crate::simulate::envoy::EnvoyConfig::load_all(path)?;
    let found = crate::simulate::envoy::coverage::check(&filters, rules);
    for line in &found.unread {
        eprintln!("warning: {line}");
    }
    let mut ok = true;
    for (lines, severity) in [
        (&found.unsent, args.unreached_rules),
        (&found.unlimited, args.unlimited_descriptors),
    ] {
        for line in lines {
            match severity {
                Severity::Error => {
                    ok = false;
                    eprintln!("error: {line}");
                }
                Severity::Warning => eprintln!("warning: {line}"),
            }
        }
    }
    if !ok {
        eprintln!(
            "the rules and {} disagree (--unreached-rules and --unlimited-descriptors choose what is an error)",
            path.display()
        );
    }
    Ok(ok)
}
