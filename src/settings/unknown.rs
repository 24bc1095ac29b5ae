//! The check that refuses unknown `TOLLGATE_*` variables.

/// The `TOLLGATE_*` variables among `names` that Tollgate does not read:
/// a typo must not silently leave a setting at its default, so any stops
/// start-up. The known names come from the command line's definition (each
/// flag's `env`), so the list cannot drift from the flags. Variables the
/// kubelet injects for a Service whose name starts with `tollgate` (such as
/// `TOLLGATE_SERVICE_HOST` or `TOLLGATE_PORT_8081_TCP`) are not typos.
pub(crate) fn unknown_env<'a>(names: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    let command = <super::Cli as clap::CommandFactory>::command();
    let mut known: Vec<String> = command
        .get_subcommands()
        .flat_map(|sub| sub.get_arguments())
        .filter_map(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .collect();
    // The tests' pointer to an Envoy binary.
    known.push("TOLLGATE_ENVOY".into());
    names
        .into_iter()
        .filter(|(name, value)| {
            name.starts_with("TOLLGATE_")
                && !known.iter().any(|k| k == name)
                && !injected_by_kubernetes(name, value)
        })
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// Whether `name=value` has the shape of a Kubernetes Service variable:
/// `<SVC>_SERVICE_HOST`, `<SVC>_SERVICE_PORT[_<PORT NAME>]`,
/// `<SVC>_PORT=tcp://…`, `<SVC>_PORT_<n>_<PROTO>[_PROTO|_PORT|_ADDR]`.
fn injected_by_kubernetes(name: &str, value: &str) -> bool {
    if name.ends_with("_SERVICE_HOST") || name.contains("_SERVICE_PORT") {
        return true;
    }
    let url_like = ["tcp://", "udp://", "sctp://"]
        .iter()
        .any(|scheme| value.starts_with(scheme));
    if name.ends_with("_PORT") && url_like {
        return true;
    }
    // ..._PORT_<digits>_<TCP|UDP|SCTP>[_SUFFIX]
    let parts: Vec<&str> = name.split('_').collect();
    parts.windows(3).any(|w| {
        w[0] == "PORT"
            && !w[1].is_empty()
            && w[1].bytes().all(|b| b.is_ascii_digit())
            && matches!(w[2], "TCP" | "UDP" | "SCTP")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_variable_is_known_and_typos_are_not() {
        let unknown = unknown_env([
            ("TOLLGATE_RULES", "x"),
            ("TOLLGATE_MAX_DESCRIPTORS", "8"),
            ("TOLLGATE_REDIS_URLL", "x"),
            ("TOLLGATE_SERVICE_HOST", "10.0.0.1"),
            ("TOLLGATE_PORT_8081_TCP_ADDR", "10.0.0.1"),
            ("TOLLGATE_PORT", "tcp://10.0.0.1:8081"),
            ("TOLLGATE_TIMEOUT", "5s"),
        ]);
        assert_eq!(unknown, ["TOLLGATE_REDIS_URLL", "TOLLGATE_TIMEOUT"]);
    }
}
