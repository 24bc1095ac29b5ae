//! `tollgate top --admin URL`: who is being limited, in a terminal,
//! refreshing (the admin page's first table, from `GET /limited`), over
//! HTTP or, for an admin port with `--admin-tls on`, HTTPS with the
//! server's certificate verified.
//!
//! Everything the server sends is shown escaped where it is not plainly
//! visible text (see [`visible`]): a rule name, a path or a client value
//! carrying escape sequences could otherwise retitle the terminal, write
//! the clipboard (OSC 52) or clear the screen, and bidi overrides or
//! invisible characters could make one client look like another.

use std::borrow::Cow;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::limited::View;

/// What `tollgate top` was asked.
#[derive(Debug, Clone)]
pub(crate) struct TopOptions {
    /// The admin port: `http://HOST:PORT`.
    pub admin: String,
    /// How often to refresh.
    pub interval: Duration,
    /// Only this domain's rules.
    pub domain: Option<String>,
    /// Only clients with a key or value containing this.
    pub search: Option<String>,
    /// Every instance's view merged (`/limited?scope=merged`), not only the
    /// one at `admin`.
    pub merged: bool,
    /// Print one frame and exit (no screen clearing).
    pub once: bool,
    /// A bearer token (for `--admin-reads token`).
    pub token: Option<String>,
    /// CA certificates (PEM) an `https://` admin port's certificate must
    /// chain to; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
}

/// Where the admin port is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// `host:port`, to connect to.
    host: String,
    /// The host's name (or address) its certificate must carry, for
    /// `https://`; `None`: plain HTTP.
    tls_name: Option<String>,
    /// A path prefix (`/admin`), or empty.
    prefix: String,
}

/// Runs the view until interrupted (or once).
pub(crate) fn run(options: &TopOptions) -> Result<(), String> {
    let target = parse_admin(&options.admin)?;
    let tls = match &target.tls_name {
        Some(_) => Some(tls_config(options.ca_file.as_deref())?),
        None => None,
    };
    let path_prefix = &target.prefix;
    let mut query = Vec::new();
    if let Some(d) = &options.domain {
        query.push(format!("domain={}", encode(d)));
    }
    if let Some(s) = &options.search {
        query.push(format!("search={}", encode(s)));
    }
    if options.merged {
        query.push("scope=merged".to_owned());
    }
    let path = match query.is_empty() {
        true => format!("{path_prefix}/limited"),
        false => format!("{path_prefix}/limited?{}", query.join("&")),
    };
    loop {
        let frame = match get(&target, tls.as_ref(), &path, options.token.as_deref()) {
            Ok(body) => match serde_json::from_str::<View>(&body) {
                Ok(view) => Ok(render(&view, &options.admin, width())),
                Err(e) => Err(format!(
                    "{}: not a /limited answer ({e}): {body}",
                    options.admin
                )),
            },
            Err(e) => Err(format!("{}: {e}", options.admin)),
        };
        // Once: an error is the exit status; refreshing, it is the screen
        // until the next try. Either way it may quote the server: escaped.
        let frame = frame.map_err(|e| visible(&e).into_owned());
        let frame = match (frame, options.once) {
            (Ok(frame), _) => frame,
            (Err(e), true) => return Err(e),
            (Err(e), false) => format!("{e}\n"),
        };
        let mut out = std::io::stdout().lock();
        let written = if options.once {
            out.write_all(frame.as_bytes())
        } else {
            // Home and clear, then the frame.
            out.write_all(b"\x1b[H\x1b[2J")
                .and_then(|()| out.write_all(frame.as_bytes()))
        };
        written
            .and_then(|()| out.flush())
            .map_err(|e| format!("stdout: {e}"))?;
        if options.once {
            return Ok(());
        }
        std::thread::sleep(options.interval);
    }
}

/// `http[s]://host[:port][/prefix]` (no scheme: `http://`).
fn parse_admin(admin: &str) -> Result<Target, String> {
    let (tls, rest) = match admin.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (true, rest),
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (false, rest),
        Some((scheme, _)) => {
            return Err(format!(
                "--admin {admin}: the scheme is http or https, not '{}'",
                visible(scheme)
            ));
        }
        None => (false, admin),
    };
    let (host, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if host.is_empty() {
        return Err(format!("--admin {admin}: no host (give http://HOST:PORT)"));
    }
    let has_port = host.contains(':') && !host.ends_with(']');
    let name = match has_port {
        true => host.rsplit_once(':').map_or(host, |(name, _)| name),
        false => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let host = match (has_port, tls) {
        (true, _) => host.to_owned(),
        (false, false) => format!("{host}:80"),
        (false, true) => format!("{host}:443"),
    };
    Ok(Target {
        host,
        tls_name: tls.then(|| name.to_owned()),
        prefix: prefix.to_owned(),
    })
}

/// The TLS client: the server's certificate must chain to `ca_file`'s
/// certificates (else the system's roots) and name the host.
fn tls_config(ca_file: Option<&std::path::Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let shown = path.display();
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("--ca-file {shown}: {e}"))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("--ca-file {shown}: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("--ca-file {shown}: {e}"))?;
            }
            if roots.is_empty() {
                return Err(format!("--ca-file {shown}: no certificate in it"));
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(
                    "no CA certificate to verify the admin port with: give --ca-file".to_owned(),
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One GET over HTTP/1.1 (in TLS when `tls` is given), the body if the
/// answer is 200.
fn get(
    target: &Target,
    tls: Option<&Arc<rustls::ClientConfig>>,
    path: &str,
    token: Option<&str>,
) -> Result<String, String> {
    let host = &target.host;
    let addr = host
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))?;
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
        .map_err(|e| format!("cannot connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n{authorization}Connection: close\r\n\r\n"
    );
    let raw = match (tls, &target.tls_name) {
        (Some(config), Some(name)) => {
            let name = rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|e| format!("{name}: {e}"))?;
            let connection = rustls::ClientConnection::new(config.clone(), name)
                .map_err(|e| format!("TLS: {e}"))?;
            exchange(rustls::StreamOwned::new(connection, stream), &request)?
        }
        _ => exchange(stream, &request)?,
    };
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!("GET {path}: HTTP {status}: {}", body.trim()));
    }
    Ok(body.to_owned())
}

/// Writes `request` and reads the answer to the end (at most 64 MiB).
fn exchange(mut stream: impl Read + Write, request: &str) -> Result<Vec<u8>, String> {
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    match stream.take(64 * 1024 * 1024).read_to_end(&mut raw) {
        Ok(_) => Ok(raw),
        // A server that closes without TLS's close_notify, after a whole
        // answer (Connection: close).
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => Ok(raw),
        Err(e) => Err(e.to_string()),
    }
}

fn width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(120)
        .max(60)
}

/// One screen: per rule, its clients heaviest first.
pub(crate) fn render(view: &View, admin: &str, width: usize) -> String {
    let now = jiff::Timestamp::now().strftime("%H:%M:%S");
    let mut out = format!(
        "tollgate top  {}  who is being limited: last {} s, {}  (updated {now} UTC)\n",
        visible(admin),
        view.window_seconds,
        visible(&view.scope)
    );
    if view.rules.is_empty() {
        out.push_str("\nNobody is being limited.\n");
        return out;
    }
    for rule in &view.rules {
        out.push_str(&format!(
            "\n{} ({})  {} refused{}\n",
            visible(&rule.rule),
            visible(&rule.domain),
            rule.refused,
            rule.source
                .as_deref()
                .map_or(String::new(), |s| format!("  at {}", visible(s)))
        ));
        out.push_str(&format!(
            "  {:>9} {:>9} {:>6}  {:<8}  {:<8}  CLIENT\n",
            "REFUSED", "ADMITTED", "SHARE", "FIRST", "LAST"
        ));
        for c in &rule.clients {
            // The time of day (UTC) of the first and the last refusal.
            let time = |t: &str| visible(t.get(11..19).unwrap_or(t)).into_owned();
            let (first, last) = (time(&c.first_refused), time(&c.last_refused));
            let who: String = c
                .descriptors
                .iter()
                .map(|d| {
                    d.iter()
                        .map(|e| format!("{}={}", e.key, e.value))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .collect::<Vec<_>>()
                .join(" | ");
            // One client, one line: control characters could forge others.
            let who: String = visible(&who)
                .chars()
                .take(width.saturating_sub(52))
                .collect();
            out.push_str(&format!(
                "  {:>9} {:>9} {:>5.0}%  {first:<8}  {last:<8}  {who}\n",
                c.refused,
                c.admitted,
                c.share * 100.0,
            ));
        }
    }
    out
}

/// `text` with every character that is not plainly visible text escaped
/// as `\u{..}`: C0 and C1 controls and DEL (terminal escapes), format
/// characters (bidi overrides and isolates, zero-width spaces and joiners,
/// the BOM, the soft hyphen, tags), line and paragraph separators, and the
/// blank fillers that render as nothing.
pub(crate) fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(crate::wire_text::hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if crate::wire_text::hidden(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(host: &str, tls_name: Option<&str>, prefix: &str) -> Target {
        Target {
            host: host.into(),
            tls_name: tls_name.map(Into::into),
            prefix: prefix.into(),
        }
    }

    #[test]
    fn admin_addresses_parse() {
        assert_eq!(
            parse_admin("http://127.0.0.1:6070").expect("ok"),
            target("127.0.0.1:6070", None, "")
        );
        assert_eq!(
            parse_admin("localhost:6070/admin/").expect("ok"),
            target("localhost:6070", None, "/admin")
        );
        assert_eq!(
            parse_admin("http://example").expect("ok").host,
            "example:80"
        );
        assert_eq!(
            parse_admin("https://admin.example:6070/x").expect("ok"),
            target("admin.example:6070", Some("admin.example"), "/x")
        );
        assert_eq!(
            parse_admin("HTTPS://[::1]").expect("ok"),
            target("[::1]:443", Some("::1"), "")
        );
        assert!(parse_admin("ftp://x:1").is_err());
        assert_eq!(encode("a b/é"), "a%20b%2F%C3%A9");
    }

    #[test]
    fn what_does_not_show_as_itself_is_escaped() {
        assert_eq!(visible("user=ann"), "user=ann");
        assert_eq!(visible("é 名前 ✓"), "é 名前 ✓");
        for (raw, shown) in [
            ("\x1b]0;owned\x07", "\\u{1b}]0;owned\\u{7}"),
            ("\x1b]52;c;Zm9v\x1b\\", "\\u{1b}]52;c;Zm9v\\u{1b}\\"),
            ("\x1b[2J", "\\u{1b}[2J"),
            ("a\u{9b}b\u{7f}", "a\\u{9b}b\\u{7f}"),
            ("admin\u{202e}nimda", "admin\\u{202e}nimda"),
            (
                "\u{2066}x\u{2069}\u{200e}\u{200f}\u{61c}",
                "\\u{2066}x\\u{2069}\\u{200e}\\u{200f}\\u{61c}",
            ),
            (
                "a\u{200b}\u{200c}\u{200d}\u{2060}\u{feff}\u{ad}b",
                "a\\u{200b}\\u{200c}\\u{200d}\\u{2060}\\u{feff}\\u{ad}b",
            ),
            ("tag\u{e0041}", "tag\\u{e0041}"),
            ("line\u{2028}two", "line\\u{2028}two"),
        ] {
            assert_eq!(visible(raw), shown, "{raw:?}");
        }
    }

    #[test]
    fn a_frame_escapes_rule_names_paths_and_clients() {
        let view: View = serde_json::from_value(serde_json::json!({
            "scope": "instance",
            "window_seconds": 300,
            "slots": 32,
            "rules": [{
                "rule": "api.\u{1b}]0;pwned\u{7}user",
                "domain": "api\u{202e}",
                "source": "rules/\u{1b}[2J.yaml:3",
                "refused": 2,
                "clients": [{
                    "descriptors": [[{"key": "user", "value": "ann\u{200b}\u{1b}]52;c;Zm9v\u{7}"}]],
                    "refused": 2,
                    "admitted": 1,
                    "share": 1.0,
                    "error": 0,
                    "id": "c1",
                    "first_refused": "2025-01-01T00:00:00Z",
                    "last_refused": "2025-01-01T00:00:01Z"
                }]
            }]
        }))
        .expect("a view");
        let frame = render(&view, "http://127.0.0.1:6070", 200);
        assert!(
            !frame
                .chars()
                .any(|c| c != '\n' && crate::wire_text::hidden(c)),
            "{frame:?}"
        );
        for shown in [
            "api.\\u{1b}]0;pwned\\u{7}user",
            "(api\\u{202e})",
            "rules/\\u{1b}[2J.yaml:3",
            "user=ann\\u{200b}\\u{1b}]52;c;Zm9v\\u{7}",
        ] {
            assert!(frame.contains(shown), "{shown} in {frame}");
        }
        // The first and the last refusal, as times of day.
        assert!(frame.contains("FIRST     LAST"), "{frame}");
        assert!(frame.contains("00:00:00  00:00:01"), "{frame}");
    }
}
