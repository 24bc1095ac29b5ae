//! A Redis client error as a store error: a misconfiguration (credentials,
//! ACL, TLS) that retrying cannot mend, or a transient failure. A leaf.

use redis::RedisError;

use crate::store::StoreError;

/// What in a Redis error says the configuration is wrong (a password, a
/// certificate), not the network or Redis's health: retrying cannot help.
fn misconfiguration(e: &RedisError) -> Option<&'static str> {
    let text = e.to_string();
    if e.kind() == redis::ErrorKind::AuthenticationFailed
        || [
            "NOAUTH",
            "WRONGPASS",
            "invalid password",
            "invalid username-password",
        ]
        .iter()
        .any(|m| text.contains(m))
    {
        return Some("Redis refused the credentials (the password in the URL, or REDIS_AUTH)");
    }
    if text.contains("NOPERM") {
        return Some("Redis's ACL does not allow Tollgate's commands (EVALSHA, SCRIPT LOAD, PING)");
    }
    let tls = [
        "certificate",
        "Certificate",
        "handshake",
        "InvalidMessage",
        "tls",
        "TLS",
    ];
    if e.is_io_error() && tls.iter().any(|m| text.contains(m)) {
        return Some(
            "the TLS handshake with Redis failed (its CA, the client certificate, or rediss:// against a plain port)",
        );
    }
    None
}

/// The store error for a Redis client error.
pub(super) fn redis_error(e: &RedisError) -> StoreError {
    if let Some(what) = misconfiguration(e) {
        return StoreError::Config(format!("{what}: {e}"));
    }
    let transient = e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_io_error()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
                | redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown)
                | redis::ErrorKind::Server(redis::ServerErrorKind::Moved)
                | redis::ErrorKind::Server(redis::ServerErrorKind::Ask)
                | redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading)
                | redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown)
                | redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        );
    StoreError::Redis {
        message: e.to_string(),
        transient,
    }
}
