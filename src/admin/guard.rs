//! Who may use the admin port from a browser.
//!
//! The admin port is for operators, probes and scrapers on the network it is
//! bound to, never for web pages. Two browser attacks reach it anyway when a
//! browser on that network opens a hostile page:
//!
//! - **Cross-site requests**: a page POSTs to `/json` (a `text/plain` body
//!   needs no CORS preflight) and spends someone's budget. State-changing
//!   requests must be `application/json` (which a cross-site page cannot send
//!   without a preflight, which is never answered), and a request whose
//!   `Origin` is not the admin address itself, or that the browser marks
//!   `Sec-Fetch-Site: cross-site`/`same-site`, is refused.
//! - **DNS rebinding**: a page on `evil.example` whose name is made to
//!   resolve to the admin address reads `/rlconfig` or `/metrics` as if
//!   same-origin. Its requests carry `Host: evil.example`, so only IP
//!   addresses, `localhost` and the names given with `--admin-hosts` are
//!   served (`--admin-hosts '*'` turns the check off).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::failures::{FailureLimits, Failures};
use super::tokens::{Scope, TokenFile, Tokens};

/// The admin port's browser rules, and who may read and reset.
#[derive(Debug, Default)]
pub(crate) struct Access {
    /// Host names served besides IP addresses and `localhost`, lowercase;
    /// `*` serves any.
    pub hosts: Vec<String>,
    /// Whether `POST /json` is served (`--admin-json`).
    pub json: bool,
    /// Requests refused (a foreign Host, a cross-site request, a body that
    /// is not JSON): `tollgate_admin_refused_total`.
    pub refused: std::sync::atomic::AtomicU64,
    /// Who may reset counters (and read, with `--admin-reads token`):
    /// `--admin-token-file`; `None`: resets are off.
    pub tokens: Option<Arc<TokenFile>>,
    /// Failed token attempts, per caller.
    pub failures: Failures,
    /// Whether reading who is limited needs a token too (`--admin-reads token`).
    pub reads_need_token: bool,
    /// The most counters one bulk reset may clear (`--admin-reset-max-keys`).
    pub reset_ceiling: usize,
}

/// The address of the caller of an admin request: a request extension
/// the admin listener adds on each connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub std::net::SocketAddr);

/// Why a request's token was not accepted.
enum Refused {
    /// No token file: resets are off.
    Off,
    /// The token file's last change did not load.
    Closed(String),
    /// Too many failures from this caller: wait this long.
    Throttled(std::time::Duration),
    /// No token, or not one of the file's.
    Wrong,
    /// A read-only token, for a reset.
    ReadOnly(String),
}

/// The most counters one bulk reset may clear unless configured
/// (`--admin-reset-max-keys`'s default).
pub(crate) const RESET_MAX_KEYS: usize = 1_000_000;

impl Access {
    /// The rules, with no request refused yet.
    pub(crate) fn new(hosts: Vec<String>, json: bool) -> Self {
        Self {
            hosts,
            json,
            reset_ceiling: RESET_MAX_KEYS,
            ..Self::default()
        }
    }

    /// Resets allowed to the bearers of the file's tokens.
    pub(crate) fn with_tokens(mut self, tokens: TokenFile) -> Self {
        self.tokens = Some(Arc::new(tokens));
        self
    }

    /// Failed token attempts throttled within `limits`.
    pub(crate) fn with_failure_limits(mut self, limits: FailureLimits) -> Self {
        self.failures = Failures::new(limits);
        self
    }

    /// At most `keys` counters cleared by one bulk reset.
    pub(crate) fn with_reset_ceiling(mut self, keys: usize) -> Self {
        self.reset_ceiling = keys;
        self
    }

    /// Reading who is limited needs a token (`--admin-reads token`).
    pub(crate) fn with_token_reads(mut self) -> Self {
        self.reads_need_token = true;
        self
    }

    /// `None` when the request may read clients' counters; else the
    /// answer. With `--admin-reads token`, any token of the file reads.
    pub(super) fn may_read(&self, headers: &HeaderMap, peer: Option<Peer>) -> Option<Response> {
        if !self.reads_need_token {
            return None;
        }
        let refused = self.check(headers, peer, Scope::Read).err()?;
        let wrong = "reading clients' counters needs Authorization: Bearer TOKEN (--admin-reads token), with a token from --admin-token-file\n";
        Some(self.refusal(refused, wrong))
    }

    /// The name of the token the request carries when it may reset
    /// counters; else the answer (403 when resets are off or the token is
    /// read-only, 401 for a missing or wrong token, 429 when the caller
    /// failed too often, 503 when the token file did not load).
    pub(super) fn may_reset(
        &self,
        headers: &HeaderMap,
        peer: Option<Peer>,
    ) -> Result<String, Box<Response>> {
        self.check(headers, peer, Scope::Reset).map_err(|refused| {
            Box::new(self.refusal(
                refused,
                "a reset needs Authorization: Bearer TOKEN, with a token from --admin-token-file\n",
            ))
        })
    }

    /// The name of the token the request carries (`Authorization: Bearer
    /// T`, the scheme in any case), when it may do `need`. Tokens are
    /// compared in constant time; a failure is counted against the caller.
    fn check(
        &self,
        headers: &HeaderMap,
        peer: Option<Peer>,
        need: Scope,
    ) -> Result<String, Refused> {
        let Some(file) = &self.tokens else {
            return Err(Refused::Off);
        };
        let caller = peer.map_or(std::net::IpAddr::from([0, 0, 0, 0]), |p| p.0.ip());
        let now = std::time::Instant::now();
        if let Some(wait) = self.failures.throttled(caller, now) {
            return Err(Refused::Throttled(wait));
        }
        let tokens = file.tokens();
        let tokens = match &*tokens {
            Tokens::Open(tokens) => tokens,
            Tokens::Closed(why) => return Err(Refused::Closed(why.clone())),
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .unwrap_or("");
        let mut found = None;
        for token in tokens {
            if !given.is_empty() && same(given.as_bytes(), token.secret.as_bytes()) {
                found = Some(token);
            }
        }
        match found {
            None => {
                self.failures.record(caller, now);
                Err(Refused::Wrong)
            }
            Some(t) if need == Scope::Reset && t.scope == Scope::Read => {
                Err(Refused::ReadOnly(t.name.clone()))
            }
            Some(t) => Ok(t.name.clone()),
        }
    }

    /// The answer to a refused token; `wrong` says what a good one is.
    fn refusal(&self, refused: Refused, wrong: &'static str) -> Response {
        match refused {
            Refused::Off => (
                StatusCode::FORBIDDEN,
                "resets are turned off: start Tollgate with --admin-token-file FILE (one token per line, NAME:TOKEN to name it in the log)\n",
            )
                .into_response(),
            Refused::Closed(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "every admin token is refused: the token file did not load ({why}); fix it and it is read again within a second\n"
                ),
            )
                .into_response(),
            Refused::Throttled(wait) => {
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, secs.to_string())],
                    format!(
                        "too many requests with a wrong or missing token from this address: try again in {secs} s (--admin-auth-max-failures)\n"
                    ),
                )
                    .into_response()
            }
            Refused::Wrong => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                wrong,
            )
                .into_response(),
            Refused::ReadOnly(name) => (
                StatusCode::FORBIDDEN,
                format!(
                    "token '{}' is read-only (a 'read' line of --admin-token-file): it cannot reset counters\n",
                    crate::rules::printable(&name)
                ),
            )
                .into_response(),
        }
    }

    pub(super) fn count_refusal(&self) {
        self.refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Requests refused so far (`tollgate_admin_refused_total`).
    pub(super) fn refused(&self) -> u64 {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a request with this `Host` header is served.
    fn host_allowed(&self, host: Option<&str>) -> bool {
        if self.hosts.iter().any(|h| h == "*") {
            return true;
        }
        // No Host (HTTP/1.0) or an empty one names no host served: refused
        // like a foreign one, so a rebinding page cannot hide it.
        let Some(host) = host.filter(|h| !h.trim().is_empty()) else {
            return false;
        };
        let name = host_name(host);
        name.parse::<std::net::IpAddr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || self
                .hosts
                .iter()
                .any(|h| h == "*" || h.eq_ignore_ascii_case(name))
    }
}

/// The name in a `Host` header: without the port, an IPv6 address without
/// its brackets.
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Whether the request comes from a page of another site, as the browser
/// says (`Sec-Fetch-Site`) or as its `Origin` shows against `Host`.
fn cross_site(headers: &HeaderMap) -> Option<String> {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
    {
        return Some(format!("Sec-Fetch-Site: {site}"));
    }
    let origin = text("origin")?;
    let host = text("host").unwrap_or("");
    let origin_host = origin
        .split_once("://")
        .map_or(origin, |(_, rest)| rest)
        .trim_end_matches('/');
    (!origin_host.eq_ignore_ascii_case(host)).then(|| format!("Origin: {origin}"))
}

/// Whether `headers` declare a JSON body (`application/json`, with or
/// without parameters).
pub(super) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The middleware: the `Host` check on every request, the cross-site check
/// on every request that is not a GET or HEAD.
pub(super) async fn guard(
    State(access): State<Arc<Access>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    if !access.host_allowed(host) {
        access.count_refusal();
        let named = match host {
            Some(host) if !host.trim().is_empty() => format!("Host '{}'", host.escape_debug()),
            _ => "a request without a Host header".to_owned(),
        };
        return (
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "admin: {named} is not served (IP addresses, localhost, or a name given with --admin-hosts)\n"
            ),
        )
            .into_response();
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD)
        && let Some(why) = cross_site(request.headers())
    {
        access.count_refusal();
        return (
            StatusCode::FORBIDDEN,
            format!(
                "admin: cross-site request refused ({})\n",
                why.escape_debug()
            ),
        )
            .into_response();
    }
    next.run(request).await
}

/// Whether `a` and `b` are equal, in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The token of an `Authorization` value whose scheme is `Bearer`, in any
/// case (RFC 9110: schemes are case-insensitive).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once([' ', '\t'])?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_served_are_addresses_localhost_and_the_named_ones() {
        let access = Access::new(vec!["tollgate.tollgate.svc".into()], true);
        for ok in [
            "127.0.0.1:6070",
            "10.1.2.3",
            "[::1]:6070",
            "localhost:6070",
            "LOCALHOST",
            "Tollgate.tollgate.svc:6070",
        ] {
            assert!(access.host_allowed(Some(ok)), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:6070",
            "127.0.0.1.evil.example",
            "localhost.evil",
        ] {
            assert!(!access.host_allowed(Some(refused)), "{refused}");
        }
        assert!(!access.host_allowed(None), "no Host");
        assert!(!access.host_allowed(Some("")), "an empty Host");
        assert!(!access.host_allowed(Some(" ")), "a blank Host");
        let any = Access::new(vec!["*".into()], true);
        assert!(any.host_allowed(Some("evil.example")));
        assert!(any.host_allowed(None));
    }

    #[test]
    fn cross_site_is_what_the_browser_or_the_origin_says() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().expect("a header value"));
            }
            h
        };
        assert_eq!(cross_site(&headers(&[("host", "127.0.0.1:6070")])), None);
        assert_eq!(
            cross_site(&headers(&[
                ("host", "127.0.0.1:6070"),
                ("origin", "http://127.0.0.1:6070")
            ])),
            None
        );
        assert!(
            cross_site(&headers(&[
                ("host", "127.0.0.1:6070"),
                ("origin", "http://127.0.0.1:8000")
            ]))
            .is_some()
        );
        assert!(cross_site(&headers(&[("host", "127.0.0.1:6070"), ("origin", "null")])).is_some());
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")])).is_some());
        assert_eq!(
            cross_site(&headers(&[("sec-fetch-site", "same-origin")])),
            None
        );
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for value in ["Bearer T1", "bearer T1", "BEARER  T1 ", "BeArEr\tT1"] {
            assert_eq!(bearer_token(value), Some("T1"), "{value}");
        }
        for value in ["Basic T1", "BearerT1", "Bearer", "T1"] {
            assert_ne!(bearer_token(value), Some("T1"), "{value}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn read_only_tokens_read_and_cannot_reset() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("tokens");
        std::fs::write(
            &path,
            "ops:0123456789abcdef\nread viewer:fedcba9876543210\n",
        )
        .expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let access = Access::new(vec![], true)
            .with_tokens(TokenFile::load(&path, true).expect("loads"))
            .with_token_reads();
        let with = |value: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, value.parse().expect("value"));
            h
        };
        let peer = Some(Peer(([192, 0, 2, 1], 5000).into()));
        assert_eq!(
            access
                .may_reset(&with("bearer 0123456789abcdef"), peer)
                .ok()
                .as_deref(),
            Some("ops")
        );
        assert!(
            access
                .may_read(&with("Bearer fedcba9876543210"), peer)
                .is_none()
        );
        let refused = access
            .may_reset(&with("Bearer fedcba9876543210"), peer)
            .expect_err("read-only");
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        let wrong = access
            .may_read(&with("Bearer 0000000000000000"), peer)
            .expect("refused");
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(access.failures.total(), 1);
    }

    #[test]
    fn json_bodies_are_declared_as_json() {
        let mut h = HeaderMap::new();
        assert!(!is_json(&h));
        h.insert(header::CONTENT_TYPE, "text/plain".parse().expect("value"));
        assert!(!is_json(&h));
        h.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().expect("value"),
        );
        assert!(is_json(&h));
    }
}
