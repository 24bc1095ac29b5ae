//! The reference service's environment variables, so an existing
//! envoyproxy/ratelimit Deployment can switch its image.
//!
//! `table.rs` lists every variable the reference reads and what Tollgate
//! does with it; an honoured one carries the function that applies it (a
//! variable cannot be listed as honoured without one), and applying them is
//! a loop over the table. Variables read together (`GRPC_HOST` with
//! `GRPC_PORT`, `REDIS_URL` with `REDIS_TYPE` and `REDIS_AUTH`, ...) share
//! one function, which reads them all and is idempotent: it runs once for
//! each of its variables that is set, with the same result.

use std::str::FromStr;
use std::time::Duration;

use super::{OnOff, ServeArgs};

mod defaults;
mod limiter;
mod listen;
mod redis;
mod stats;
mod table;
mod xds;

pub(crate) use defaults::REFERENCE_PROGRAM;
use table::{Handling, REFERENCE_VARS};

/// Applies one variable (and those read with it) to the settings.
type Apply = fn(&mut ServeArgs, &Vars<'_>) -> Result<(), String>;

impl ServeArgs {
    /// Applies the reference service's environment variables (so an existing
    /// Deployment can switch its image). `explicit(id)` tells whether a flag
    /// was set on the command line or by its `TOLLGATE_*` variable; a
    /// reference variable that contradicts one stops start-up.
    pub(crate) fn apply_reference_env(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        explicit: &dyn Fn(&str) -> bool,
    ) -> Result<(), String> {
        refused_vars(env)?;
        let vars = Vars { env, explicit };
        for var in REFERENCE_VARS {
            if let Handling::Honoured { apply, .. } = var.handling
                && vars.set(var.name).is_some()
            {
                apply(self, &vars)?;
            }
        }
        if !(0.0..=1.0).contains(&self.near_limit_ratio) {
            return Err(format!(
                "near limit ratio {} must be between 0 and 1",
                self.near_limit_ratio
            ));
        }
        Ok(())
    }
}

/// The environment as the apply functions read it, and the flags set
/// explicitly.
pub(super) struct Vars<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    explicit: &'a dyn Fn(&str) -> bool,
}

impl Vars<'_> {
    /// A variable's value, trimmed; `None` when unset or empty (an empty
    /// variable is an unset one, as for the reference's `envconfig` with a
    /// default).
    pub(super) fn set(&self, name: &str) -> Option<String> {
        (self.env)(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    /// A boolean (`true`/`1`/`yes`, `false`/`0`/`no`, any case); anything
    /// else is an error naming the variable.
    pub(super) fn boolean(&self, name: &str) -> Result<Option<bool>, String> {
        match self.set(name).map(|v| v.to_ascii_lowercase()).as_deref() {
            None => Ok(None),
            Some("true" | "1" | "yes") => Ok(Some(true)),
            Some("false" | "0" | "no") => Ok(Some(false)),
            Some(other) => Err(format!("{name}={other}: expected true or false")),
        }
    }

    /// A duration (`100ms`, `5s`, or Go's forms such as `1m30s`).
    pub(super) fn duration(&self, name: &str) -> Result<Option<Duration>, String> {
        self.set(name)
            .map(|v| super::parse_duration(&v).map_err(|e| format!("{name}={v}: {e}")))
            .transpose()
    }

    /// A number.
    pub(super) fn number<T: FromStr>(&self, name: &str) -> Result<Option<T>, String> {
        self.set(name)
            .map(|v| v.parse().map_err(|_| format!("{name}={v}: not a number")))
            .transpose()
    }

    /// Whether the flag `id` was set on the command line or by its
    /// `TOLLGATE_*` variable.
    pub(super) fn explicit(&self, id: &str) -> bool {
        (self.explicit)(id)
    }

    /// Takes a variable's value for the flag `id`'s field: a value that
    /// contradicts the flag, set explicitly, stops start-up naming both;
    /// otherwise the variable wins over the default.
    pub(super) fn adopt<T: PartialEq>(
        &self,
        field: &mut T,
        value: T,
        id: &str,
        var: &str,
    ) -> Result<(), String> {
        if self.explicit(id) && *field != value {
            return Err(format!(
                "{var} (envoyproxy/ratelimit's setting) contradicts --{}; set one of them",
                flag_name(id)
            ));
        }
        *field = value;
        Ok(())
    }
}

/// The long name of `serve`'s flag `id`.
fn flag_name(id: &str) -> String {
    let command = <super::Cli as clap::CommandFactory>::command();
    command
        .find_subcommand("serve")
        .and_then(|serve| serve.get_arguments().find(|a| a.get_id() == id))
        .and_then(|arg| arg.get_long())
        .map_or_else(|| id.replace('_', "-"), str::to_owned)
}

/// `on` as a switch.
fn on_off(on: bool) -> OnOff {
    if on { OnOff::On } else { OnOff::Off }
}

/// Every set reference variable Tollgate refuses, each with its reason, or
/// `Ok` when there is none.
fn refused_vars(env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    let mut refusals = Vec::new();
    for var in REFERENCE_VARS {
        let Handling::Refused { harmless, why } = var.handling else {
            continue;
        };
        let Some(value) = env(var.name) else {
            continue;
        };
        let value = value.trim();
        if value.is_empty() || harmless.iter().any(|h| h.eq_ignore_ascii_case(value)) {
            continue;
        }
        refusals.push(format!("{}={value}: {why}", var.name));
    }
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "envoyproxy/ratelimit setting(s) Tollgate cannot honour: {}",
            refusals.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests;
