//! One start-up path: the command line and the environment read into
//! settings, the same for the `tollgate` binary and the in-process harness.
//!
//! The environment is injected ([`Env`]): the binary passes the process's,
//! a test passes its own. clap reads `env = "TOLLGATE_*"` from the process
//! when the command is built, so the flags are parsed without it and each
//! variable the command line left unset is given to clap as the flag it
//! stands for: its value goes through the flag's own parser.

use std::ffi::OsString;
use std::path::Path;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory, FromArgMatches};

use super::reference::REFERENCE_PROGRAM;
use super::{Cli, Command, unknown_env};

/// Environment variables, as start-up reads them.
#[derive(Debug, Clone, Default)]
pub struct Env(Vec<(String, String)>);

impl Env {
    /// The process's environment (names and values that are not UTF-8 are
    /// read lossily).
    pub fn process() -> Self {
        Self(
            std::env::vars_os()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.to_string_lossy().into_owned(),
                    )
                })
                .collect(),
        )
    }

    /// The given variables only.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self(
            pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }

    /// One variable's value (the last, if given twice).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every variable.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Why start-up stops before anything runs.
#[derive(Debug)]
pub(crate) enum LoadError {
    /// clap's own answer: a usage error, or `--help` and `--version` (which
    /// are not failures: see [`clap::Error::exit_code`]).
    Usage(clap::Error),
    /// A setting refused, the whole line to print.
    Refused(String),
}

impl std::fmt::Display for LoadError {
    /// What start-up prints.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Usage(e) => e.fmt(f),
            Self::Refused(line) => f.write_str(line),
        }
    }
}

/// Reads the command line (`argv[0]` included: run as `ratelimit`, Tollgate
/// is the reference's binary) and the environment into what to run: the
/// `TOLLGATE_*` variables, an unknown one refused, and for `serve` the
/// reference's defaults and variables.
pub(crate) fn load<T: Into<OsString>>(
    argv: impl IntoIterator<Item = T>,
    env: &Env,
) -> Result<Cli, LoadError> {
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let as_reference = argv
        .first()
        .and_then(|arg0| Path::new(arg0).file_name())
        .is_some_and(|name| name == REFERENCE_PROGRAM);
    let argv = if as_reference {
        if argv.len() > 1 {
            return Err(LoadError::Refused(format!(
                "{REFERENCE_PROGRAM}: takes no arguments (it is configured by envoyproxy/ratelimit's \
                 environment variables); run `tollgate serve --help` for Tollgate's flags"
            )));
        }
        vec!["tollgate".into(), "serve".into()]
    } else {
        argv
    };
    let matches = parse_with_env(&argv, env)?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(LoadError::Usage)?;
    let refused = |e: String| LoadError::Refused(format!("tollgate: {e}; not starting"));
    let lookup = |name: &str| env.get(name).map(str::to_owned);
    match &mut cli.command {
        Command::Serve(args) => {
            let unknown = unknown_env(env.iter());
            if !unknown.is_empty() {
                return Err(LoadError::Refused(format!(
                    "tollgate: unknown setting(s) {}; not starting (see `tollgate serve --help`)",
                    unknown.join(", ")
                )));
            }
            let serve = matches.subcommand_matches("serve");
            // Set on the command line or by its TOLLGATE_* variable.
            let explicit = |id: &str| {
                serve
                    .and_then(|m| m.value_source(id))
                    .is_some_and(|s| s == ValueSource::CommandLine)
            };
            if as_reference {
                args.reference_defaults(&explicit);
            }
            args.apply_reference_env(&lookup, &explicit)
                .map_err(refused)?;
        }
        Command::Check(args) => args.rule_load.apply_reference_env(&lookup),
        Command::Simulate(args) => args.rule_load.apply_reference_env(&lookup),
        Command::Top(_) => {}
    }
    Ok(cli)
}

/// The command line with the environment's `TOLLGATE_*` variables, each
/// where its flag is not on the command line.
fn parse_with_env(argv: &[OsString], env: &Env) -> Result<ArgMatches, LoadError> {
    let described = Cli::command();
    // The same command with no variable read from the process.
    let plain = described
        .clone()
        .mut_subcommands(|sub| sub.mut_args(|arg| arg.env(None)));
    let first = match plain.clone().try_get_matches_from(argv) {
        Ok(m) => m,
        // For --help (which lists the variables) and for usage errors, the
        // command as described answers.
        Err(e) => {
            return Err(LoadError::Usage(
                described.try_get_matches_from(argv).err().unwrap_or(e),
            ));
        }
    };
    let Some((name, sub)) = first.subcommand() else {
        return Ok(first);
    };
    let mut more: Vec<OsString> = Vec::new();
    for arg in described
        .find_subcommand(name)
        .into_iter()
        .flat_map(|s| s.get_arguments())
    {
        let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
            continue;
        };
        let Some(value) = var.to_str().and_then(|v| env.get(v)) else {
            continue;
        };
        if value.is_empty()
            || sub.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine)
        {
            continue;
        }
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            match boolish(value) {
                Some(true) => more.push(format!("--{long}").into()),
                Some(false) => {}
                None => {
                    return Err(LoadError::Refused(format!(
                        "tollgate: {}={value}: expected true or false; not starting",
                        var.to_string_lossy()
                    )));
                }
            }
        } else {
            more.push(format!("--{long}={value}").into());
        }
    }
    if more.is_empty() {
        return Ok(first);
    }
    let full: Vec<OsString> = argv.iter().cloned().chain(more).collect();
    plain.try_get_matches_from(&full).map_err(LoadError::Usage)
}

/// clap's reading of a variable for an on/off flag.
fn boolish(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "y" | "on" | "1" => Some(true),
        "false" | "no" | "n" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// `serve`'s settings from `argv` (`argv[0]` included) and `env`, or the
/// line start-up would print; for tests.
#[cfg(test)]
pub(super) fn serve_args<'a>(
    argv: impl IntoIterator<Item = &'a str>,
    env: &[(&str, &str)],
) -> Result<super::ServeArgs, String> {
    match load(argv, &Env::from_pairs(env.iter().copied())) {
        Ok(Cli {
            command: Command::Serve(args),
        }) => Ok(*args),
        Ok(_) => Err("not serve".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(argv: &[&str], env: &[(&str, &str)]) -> Result<super::super::ServeArgs, String> {
        serve_args(argv.iter().copied(), env)
    }

    #[test]
    fn variables_fill_what_the_command_line_leaves_unset() {
        let args = serve(
            &["tollgate", "serve", "--max-descriptors", "9"],
            &[
                ("TOLLGATE_MAX_DESCRIPTORS", "3"),
                ("TOLLGATE_MAX_ENTRIES", "4"),
                ("TOLLGATE_RULES", "a,b"),
                ("TOLLGATE_SHADOW_MODE", "true"),
                ("TOLLGATE_QUOTA_MODE", "false"),
            ],
        )
        .expect("loads");
        assert_eq!(args.max_descriptors, 9, "the command line wins");
        assert_eq!(args.max_entries, 4);
        assert_eq!(args.rules.len(), 2);
        assert!(args.shadow_mode);
        assert!(!args.quota_mode);
    }

    #[test]
    fn bad_values_unknown_variables_and_reference_contradictions_are_refused() {
        let e = serve(&["tollgate", "serve"], &[("TOLLGATE_MAX_ENTRIES", "many")])
            .expect_err("not a number");
        assert!(e.contains("max-entries"), "{e}");
        let e = serve(&["tollgate", "serve"], &[("TOLLGATE_SHADOW_MODE", "maybe")])
            .expect_err("not a boolean");
        assert!(e.contains("TOLLGATE_SHADOW_MODE=maybe"), "{e}");
        let e = serve(&["tollgate", "serve"], &[("TOLLGATE_MAX_ENTRIE", "4")]).expect_err("a typo");
        assert!(e.contains("unknown setting(s) TOLLGATE_MAX_ENTRIE"), "{e}");
        let e = serve(
            &["tollgate", "serve", "--redis-timeout", "1s"],
            &[("REDIS_TIMEOUT", "2s")],
        )
        .expect_err("a contradiction");
        assert!(e.contains("REDIS_TIMEOUT"), "{e}");
        let e = serve(&["/bin/ratelimit", "serve"], &[]).expect_err("no arguments");
        assert!(e.starts_with("ratelimit: takes no arguments"), "{e}");
    }

    #[test]
    fn as_the_reference_binary_its_defaults_then_its_variables_apply() {
        let args = serve(&["/bin/ratelimit"], &[("GRPC_PORT", "9000")]).expect("loads");
        assert_eq!(args.grpc_addr.to_string(), "0.0.0.0:9000");
        assert_eq!(args.log_level, "warn");
        assert_eq!(args.admin_addr.len(), 2);
        let args = serve(&["tollgate", "serve"], &[("GRPC_PORT", "9000")]).expect("loads");
        assert_eq!(args.log_level, "info", "Tollgate's own defaults");
    }

    #[test]
    fn merge_domain_config_reaches_every_command_that_loads_rules() {
        let env = Env::from_pairs([("MERGE_DOMAIN_CONFIG", "true")]);
        let Ok(Cli {
            command: Command::Check(check),
        }) = load(["tollgate", "check", "rules.yaml"], &env)
        else {
            panic!("check loads");
        };
        assert!(check.load_options().merge_domains);
        let Ok(Cli {
            command: Command::Check(check),
        }) = load(["tollgate", "check", "rules.yaml"], &Env::default())
        else {
            panic!("check loads");
        };
        assert!(!check.load_options().merge_domains);
    }
}
