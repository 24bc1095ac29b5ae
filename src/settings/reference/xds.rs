//! The reference's xDS variables: `CONFIG_TYPE=GRPC_XDS_SOTW` with its
//! `CONFIG_GRPC_XDS_*`, `XDS_CLIENT_*` and `FORCE_START_WITHOUT_INITIAL_CONFIG`.

use std::path::PathBuf;

use super::Vars;
use crate::settings::{OnOff, ServeArgs};

/// Whether `CONFIG_TYPE` says rules come from xDS.
fn from_xds(vars: &Vars<'_>) -> Result<bool, String> {
    match vars
        .set("CONFIG_TYPE")
        .map(|t| t.to_ascii_uppercase())
        .as_deref()
    {
        None | Some("FILE") => Ok(false),
        Some("GRPC_XDS_SOTW") => Ok(true),
        Some(other) => Err(format!(
            "CONFIG_TYPE={other}: expected FILE or GRPC_XDS_SOTW"
        )),
    }
}

/// `--rules` from `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY`
/// (not read when rules come from xDS).
pub(super) fn runtime(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    let Some(root) = vars.set("RUNTIME_ROOT") else {
        return Ok(());
    };
    if from_xds(vars)? {
        return Ok(());
    }
    let sub = vars.set("RUNTIME_SUBDIRECTORY").unwrap_or_default();
    let app = vars
        .set("RUNTIME_APPDIRECTORY")
        .unwrap_or_else(|| "config".into());
    let rules = vec![PathBuf::from(root).join(sub).join(app)];
    vars.adopt(&mut args.rules, rules, "rules", "RUNTIME_ROOT")
}

/// Rules over xDS from the reference's `CONFIG_TYPE=GRPC_XDS_SOTW` and its
/// `CONFIG_GRPC_XDS_*`, `XDS_CLIENT_*` and
/// `FORCE_START_WITHOUT_INITIAL_CONFIG` variables.
pub(super) fn xds(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    let set = |name: &str| vars.set(name);
    let explicit = |id: &str| vars.explicit(id);
    if !from_xds(vars)? {
        return Ok(());
    }
    if explicit("rules") {
        return Err("CONFIG_TYPE=GRPC_XDS_SOTW (envoyproxy/ratelimit's setting) contradicts --rules; set one of them".into());
    }
    let boolean = |name: &str| vars.boolean(name);
    let duration = |name: &str| vars.duration(name);
    let x = &mut args.xds;
    let tls = boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS")?.unwrap_or(false);
    let server = set("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or_else(|| "localhost:18000".into());
    let url = format!("{}://{server}", if tls { "https" } else { "http" });
    vars.adopt(
        &mut x.rules_xds,
        Some(url),
        "rules_xds",
        "CONFIG_GRPC_XDS_SERVER_URL",
    )?;
    if let Some(id) = set("CONFIG_GRPC_XDS_NODE_ID") {
        vars.adopt(
            &mut x.xds_node_id,
            id,
            "xds_node_id",
            "CONFIG_GRPC_XDS_NODE_ID",
        )?;
    }
    // "key1=val1,key2=val2"; entries without '=' are skipped, as the
    // reference does.
    if let Some(metadata) = set("CONFIG_GRPC_XDS_NODE_METADATA") {
        let pairs = metadata
            .split(',')
            .filter_map(|e| e.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        vars.adopt(
            &mut x.xds_node_metadata,
            pairs,
            "xds_node_metadata",
            "CONFIG_GRPC_XDS_NODE_METADATA",
        )?;
    }
    // envconfig's map form: "key1:val1,key2:val2".
    if let Some(headers) = set("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS") {
        let mut pairs = Vec::new();
        for entry in headers.split(',') {
            let (k, v) = entry.split_once(':').ok_or_else(|| {
                format!("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: '{entry}' is not key:value")
            })?;
            pairs.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
        vars.adopt(
            &mut x.xds_headers,
            pairs,
            "xds_headers",
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        )?;
    }
    let files = [
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "xds_ca"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "xds_client_cert"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds_client_key"),
    ];
    for (name, id) in files {
        let Some(path) = set(name) else { continue };
        if !tls {
            return Err(format!(
                "{name} is set but CONFIG_GRPC_XDS_SERVER_USE_TLS is not true"
            ));
        }
        let field = match id {
            "xds_ca" => &mut x.xds_ca,
            "xds_client_cert" => &mut x.xds_client_cert,
            _ => &mut x.xds_client_key,
        };
        vars.adopt(field, Some(PathBuf::from(path)), id, name)?;
    }
    if let Some(san) = set("CONFIG_GRPC_XDS_SERVER_TLS_SAN") {
        vars.adopt(
            &mut x.xds_server_name,
            Some(san),
            "xds_server_name",
            "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        )?;
    }
    if let Some(d) = duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")? {
        vars.adopt(
            &mut x.xds_connect_retry,
            d,
            "xds_connect_retry",
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        )?;
    }
    if let Some(d) = duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")? {
        vars.adopt(
            &mut x.xds_backoff_initial,
            d,
            "xds_backoff_initial",
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        )?;
    }
    if let Some(d) = duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL")? {
        vars.adopt(
            &mut x.xds_backoff_max,
            d,
            "xds_backoff_max",
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        )?;
    }
    let jitter = boolean("XDS_CLIENT_BACKOFF_JITTER")?.unwrap_or(true);
    let factor = match set("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
        Some(f) => Some(
            f.parse::<f64>()
                .ok()
                .filter(|f| (0.0..=1.0).contains(f))
                .ok_or_else(|| {
                    format!("XDS_CLIENT_BACKOFF_RANDOM_FACTOR={f}: expected a number from 0 to 1")
                })?,
        ),
        None => None,
    };
    if !jitter || factor.is_some() {
        let value = if jitter { factor.unwrap_or(0.5) } else { 0.0 };
        vars.adopt(
            &mut x.xds_backoff_random_factor,
            value,
            "xds_backoff_random_factor",
            "XDS_CLIENT_BACKOFF_RANDOM_FACTOR/JITTER",
        )?;
    }
    if let Some(size) = set("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
        let bytes: usize = size
            .parse()
            .map_err(|_| format!("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES={size}: not a number"))?;
        if bytes > 0 {
            vars.adopt(
                &mut x.xds_max_message_bytes,
                bytes,
                "xds_max_message_bytes",
                "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
            )?;
        }
    }
    if let Some(force) = boolean("FORCE_START_WITHOUT_INITIAL_CONFIG")? {
        let wait = if force { OnOff::Off } else { OnOff::On };
        vars.adopt(
            &mut x.xds_wait_for_rules,
            wait,
            "xds_wait_for_rules",
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
        )?;
    }
    Ok(())
}
