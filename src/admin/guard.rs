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

/// The admin port's browser rules.
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
    /// Who may reset counters: `(name, token)` from `--admin-token-file`;
    /// `None`: resets are off.
    pub tokens: Option<Vec<(String, String)>>,
    /// Whether reading who is limited needs a token too (`--admin-reads token`).
    pub reads_need_token: bool,
    /// The most counters one bulk reset may clear (`--admin-reset-max-keys`).
    pub reset_ceiling: usize,
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
            refused: std::sync::atomic::AtomicU64::new(0),
            tokens: None,
            reads_need_token: false,
            reset_ceiling: RESET_MAX_KEYS,
        }
    }

    /// Resets allowed to the bearers of `tokens`.
    pub(crate) fn with_tokens(mut self, tokens: Vec<(String, String)>) -> Self {
        self.tokens = Some(tokens);
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

    /// `None` when `headers` may read who is limited; else the answer.
    pub(super) fn may_read(&self, headers: &HeaderMap) -> Option<Response> {
        if !self.reads_need_token {
            return None;
        }
        match self.bearer(headers) {
            Ok(_) => None,
            Err((status, _)) => Some(
                (
                    status,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "reading who is limited needs Authorization: Bearer TOKEN (--admin-reads token)\n",
                )
                    .into_response(),
            ),
        }
    }

    /// The name of the token `headers` carry (`Authorization: Bearer T`),
    /// `Err` with the status to answer: 403 when resets are off, 401 for a
    /// missing or wrong token. Tokens are compared in constant time.
    pub(super) fn bearer(&self, headers: &HeaderMap) -> Result<&str, (StatusCode, &'static str)> {
        let Some(tokens) = &self.tokens else {
            return Err((
                StatusCode::FORBIDDEN,
                "resets are turned off: start Tollgate with --admin-token-file FILE (one token per line, NAME:TOKEN to name it in the log)\n",
            ));
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .unwrap_or("");
        let mut found = None;
        for (name, token) in tokens {
            if !given.is_empty() && same(given.as_bytes(), token.as_bytes()) {
                found = Some(name.as_str());
            }
        }
        found.ok_or((
            StatusCode::UNAUTHORIZED,
            "a reset needs Authorization: Bearer TOKEN, with a token from --admin-token-file\n",
        ))
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
        let Some(host) = host else {
            // HTTP/1.0 without Host: not a browser.
            return true;
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
        let host = host.unwrap_or_default().to_owned();
        return (
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "admin: Host '{}' is not served (IP addresses, localhost, or a name given with --admin-hosts)\n",
                host.escape_debug()
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

/// Reads `--admin-token-file`: a token per line (`NAME:TOKEN` names it;
/// otherwise it is `token N`), blank lines and `#` comments skipped.
pub(crate) fn read_tokens(path: &std::path::Path) -> Result<Vec<(String, String)>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--admin-token-file {}: {e}", path.display()))?;
    let mut tokens = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, token) = match line.split_once(':') {
            Some((name, token)) => (name.trim().to_owned(), token.trim().to_owned()),
            None => (format!("token {}", tokens.len() + 1), line.to_owned()),
        };
        if token.len() < 16 {
            return Err(format!(
                "--admin-token-file {}: token '{name}' is shorter than 16 characters",
                path.display()
            ));
        }
        tokens.push((name, token));
    }
    if tokens.is_empty() {
        return Err(format!(
            "--admin-token-file {}: no token in it",
            path.display()
        ));
    }
    Ok(tokens)
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
        assert!(access.host_allowed(None));
        let any = Access::new(vec!["*".into()], true);
        assert!(any.host_allowed(Some("evil.example")));
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
