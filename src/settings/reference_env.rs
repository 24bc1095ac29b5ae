//! Reading the reference service's variables: the value of one, a boolean,
//! and taking one for a setting of ours. A leaf that every `reference_*`
//! file uses.

/// A reference variable's value, trimmed; `None` when unset or empty.
pub(super) fn set_var(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    env(name)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A reference boolean (`true`/`1`/`yes`, `false`/`0`/`no`); `None` when
/// unset or empty; anything else is an error naming the variable.
pub(super) fn bool_var(
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<bool>, String> {
    match set_var(env, name)
        .map(|v| v.to_ascii_lowercase())
        .as_deref()
    {
        None => Ok(None),
        Some("true" | "1" | "yes") => Ok(Some(true)),
        Some("false" | "0" | "no") => Ok(Some(false)),
        Some(other) => Err(format!("{name}={other}: expected true or false")),
    }
}

/// Takes a reference variable's value for one of our settings: a value that
/// contradicts an explicitly set flag stops start-up naming both; otherwise
/// the variable wins over the default.
pub(super) fn adopt<T: PartialEq>(
    field: &mut T,
    value: T,
    explicit: bool,
    flag: &str,
    var: &str,
) -> Result<(), String> {
    if explicit && *field != value {
        return Err(format!(
            "{var} (envoyproxy/ratelimit's setting) contradicts --{flag}; set one of them"
        ));
    }
    *field = value;
    Ok(())
}
