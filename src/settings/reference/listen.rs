//! The reference's listeners and logs: `GRPC_HOST`/`GRPC_PORT`,
//! `HOST`/`PORT` and `DEBUG_HOST`/`DEBUG_PORT`, gRPC TLS from its
//! `GRPC_SERVER_*` and `GRPC_CLIENT_*` variables, `LOG_LEVEL`, `LOG_FORMAT`.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::Vars;
use crate::settings::{LogFormat, OnOff, ServeArgs};

/// `--grpc-addr` from `GRPC_HOST:GRPC_PORT`.
pub(super) fn grpc_addr(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(addr) = listen_addr(vars, "GRPC_HOST", "GRPC_PORT")? {
        vars.adopt(&mut args.grpc_addr, addr, "grpc_addr", "GRPC_PORT")?;
    }
    Ok(())
}

/// `--admin-addr` from `HOST:PORT` and `DEBUG_HOST:DEBUG_PORT` (one
/// address when both are the same).
pub(super) fn admin_addrs(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    let mut admin = Vec::new();
    for (host, port) in [("HOST", "PORT"), ("DEBUG_HOST", "DEBUG_PORT")] {
        if let Some(addr) = listen_addr(vars, host, port)?
            && !admin.contains(&addr)
        {
            admin.push(addr);
        }
    }
    if !admin.is_empty() {
        vars.adopt(&mut args.admin_addr, admin, "admin_addr", "PORT/DEBUG_PORT")?;
    }
    Ok(())
}

/// The address from a `HOST`/`PORT`-style pair, when the port is set (the
/// host defaults to all interfaces, as in the reference).
fn listen_addr(
    vars: &Vars<'_>,
    host_var: &str,
    port_var: &str,
) -> Result<Option<SocketAddr>, String> {
    let Some(port) = vars.set(port_var) else {
        return Ok(None);
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{port_var}={port}: not a port"))?;
    let host = vars.set(host_var).unwrap_or_else(|| "0.0.0.0".into());
    let addr = format!("{host}:{port}")
        .parse()
        .map_err(|_| format!("{host_var}={host}: not an IP address"))?;
    Ok(Some(addr))
}

/// `--log-level` from `LOG_LEVEL` (the reference's level names).
pub(super) fn log_level(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(level) = vars.set("LOG_LEVEL") {
        let level = crate::settings::values::reference_log_level(&level)?.to_owned();
        vars.adopt(&mut args.log_level, level, "log_level", "LOG_LEVEL")?;
    }
    Ok(())
}

/// `--log-format` from `LOG_FORMAT`.
pub(super) fn log_format(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(format) = vars.set("LOG_FORMAT") {
        let format = match format.to_ascii_lowercase().as_str() {
            "json" => LogFormat::Json,
            "text" => LogFormat::Text,
            other => return Err(format!("LOG_FORMAT={other}: expected text or json")),
        };
        vars.adopt(&mut args.log_format, format, "log_format", "LOG_FORMAT")?;
    }
    Ok(())
}

/// gRPC TLS from `GRPC_SERVER_USE_TLS`, `GRPC_SERVER_TLS_CERT`,
/// `GRPC_SERVER_TLS_KEY`, `GRPC_CLIENT_TLS_CACERT` (client certificates
/// required when set) and `GRPC_CLIENT_TLS_SAN`. A file without
/// `GRPC_SERVER_USE_TLS=true` stops start-up: the server would be plaintext.
pub(super) fn grpc_tls(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    let on = vars.boolean("GRPC_SERVER_USE_TLS")?.unwrap_or(false);
    let file = |name: &str| vars.set(name).map(PathBuf::from);
    let (cert, key, ca) = (
        file("GRPC_SERVER_TLS_CERT"),
        file("GRPC_SERVER_TLS_KEY"),
        file("GRPC_CLIENT_TLS_CACERT"),
    );
    if !on {
        if let Some(name) = [
            ("GRPC_SERVER_TLS_CERT", &cert),
            ("GRPC_SERVER_TLS_KEY", &key),
            ("GRPC_CLIENT_TLS_CACERT", &ca),
        ]
        .iter()
        .find_map(|(name, v)| v.is_some().then_some(name))
        {
            return Err(format!(
                "{name} is set but GRPC_SERVER_USE_TLS is not true: the server would be plaintext"
            ));
        }
        return Ok(());
    }
    let (Some(cert), Some(key)) = (cert, key) else {
        return Err(
            "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY".into(),
        );
    };
    vars.adopt(
        &mut args.tls_cert,
        Some(cert),
        "tls_cert",
        "GRPC_SERVER_TLS_CERT",
    )?;
    vars.adopt(
        &mut args.tls_key,
        Some(key),
        "tls_key",
        "GRPC_SERVER_TLS_KEY",
    )?;
    // The reference's TLS is for gRPC only: its HTTP port (health probes)
    // stays plain.
    vars.adopt(
        &mut args.admin_tls,
        OnOff::Off,
        "admin_tls",
        "GRPC_SERVER_USE_TLS",
    )?;
    let san = vars.set("GRPC_CLIENT_TLS_SAN");
    if san.is_some() && ca.is_none() {
        return Err(
            "GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT (client certificates)".into(),
        );
    }
    if san.is_some() {
        vars.adopt(
            &mut args.tls_client_san,
            san,
            "tls_client_san",
            "GRPC_CLIENT_TLS_SAN",
        )?;
    }
    if ca.is_some() {
        vars.adopt(
            &mut args.tls_client_ca,
            ca,
            "tls_client_ca",
            "GRPC_CLIENT_TLS_CACERT",
        )?;
    }
    Ok(())
}
