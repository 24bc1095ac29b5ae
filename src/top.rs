//! `tollgate top --admin URL`: who is being limited, in a terminal,
//! refreshing (the admin page's first table, from `GET /limited`).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
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
    /// Print one frame and exit (no screen clearing).
    pub once: bool,
    /// A bearer token (for `--admin-reads token`).
    pub token: Option<String>,
}

/// Runs the view until interrupted (or once).
pub(crate) fn run(options: &TopOptions) -> Result<(), String> {
    let (host, path_prefix) = parse_admin(&options.admin)?;
    let mut query = Vec::new();
    if let Some(d) = &options.domain {
        query.push(format!("domain={}", encode(d)));
    }
    if let Some(s) = &options.search {
        query.push(format!("search={}", encode(s)));
    }
    let path = match query.is_empty() {
        true => format!("{path_prefix}/limited"),
        false => format!("{path_prefix}/limited?{}", query.join("&")),
    };
    loop {
        let frame = match get(&host, &path, options.token.as_deref()) {
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
        // until the next try.
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

/// `http://host:port[/prefix]` -> (`host:port`, `/prefix`).
fn parse_admin(admin: &str) -> Result<(String, String), String> {
    if admin.starts_with("https://") {
        return Err(format!(
            "{admin}: tollgate top speaks plain HTTP only; read an admin port with --admin-tls on through `curl --cacert CA {admin}/limited`"
        ));
    }
    let rest = admin.strip_prefix("http://").unwrap_or(admin);
    let (host, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if host.is_empty() {
        return Err(format!("{admin}: no host (give http://HOST:PORT)"));
    }
    let host = match host.contains(':') && !host.ends_with(']') {
        true => host.to_owned(),
        false => format!("{host}:80"),
    };
    Ok((host, prefix.to_owned()))
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

/// One GET over HTTP/1.1, the body if the answer is 200.
fn get(host: &str, path: &str, token: Option<&str>) -> Result<String, String> {
    let addr = host
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
        .map_err(|e| format!("cannot connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n{authorization}Connection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    stream
        .take(64 * 1024 * 1024)
        .read_to_end(&mut raw)
        .map_err(|e| e.to_string())?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!("GET {path}: HTTP {status}: {}", body.trim()));
    }
    Ok(body.to_owned())
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
        "tollgate top  {admin}  who is being limited: last {} s, {}  (updated {now} UTC)\n",
        view.window_seconds, view.scope
    );
    if view.rules.is_empty() {
        out.push_str("\nNobody is being limited.\n");
        return out;
    }
    for rule in &view.rules {
        out.push_str(&format!(
            "\n{} ({})  {} refused{}\n",
            rule.rule,
            rule.domain,
            rule.refused,
            rule.source
                .as_deref()
                .map_or(String::new(), |s| format!("  at {s}"))
        ));
        out.push_str(&format!(
            "  {:>9} {:>9} {:>6}  {:<8}  CLIENT\n",
            "REFUSED", "ADMITTED", "SHARE", "LAST"
        ));
        for c in &rule.clients {
            let last = c.last_refused.get(11..19).unwrap_or(&c.last_refused);
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
            let who: String = who
                .chars()
                .map(|ch| if ch.is_control() { '?' } else { ch })
                .take(width.saturating_sub(42))
                .collect();
            out.push_str(&format!(
                "  {:>9} {:>9} {:>5.0}%  {:<8}  {who}\n",
                c.refused,
                c.admitted,
                c.share * 100.0,
                last
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addresses_parse() {
        assert_eq!(
            parse_admin("http://127.0.0.1:6070").expect("ok"),
            ("127.0.0.1:6070".into(), String::new())
        );
        assert_eq!(
            parse_admin("localhost:6070/admin/").expect("ok"),
            ("localhost:6070".into(), "/admin".into())
        );
        assert_eq!(parse_admin("http://example").expect("ok").0, "example:80");
        assert!(parse_admin("https://x:1").is_err());
        assert_eq!(encode("a b/é"), "a%20b%2F%C3%A9");
    }
}
