//! Shared helpers for black-box tests: start a real `tollgate serve` on a
//! free port and talk to it over gRPC.
#![allow(dead_code, unreachable_pub)]
// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

/// A running `tollgate serve`, killed on drop.
pub struct Tollgate {
    pub child: Child,
    pub addr: SocketAddr,
    /// Admin HTTP.
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
    /// Everything the server wrote to stderr so far.
    pub stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Tollgate {
    /// Starts the server on `rules` (YAML text) with extra arguments.
    pub fn start(rules: &str, args: &[&str]) -> Self {
        Self::start_with_env(rules, args, &[])
    }

    /// As [`Tollgate::start`], with environment variables.
    pub fn start_with_env(rules: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let (dir, rules) = rules_file(rules, args);
        let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        command.arg("serve");
        if let Some(path) = &rules {
            command.args(["--rules", path]);
        }
        // Free ports unless the test chose its own (to restart on the same one).
        if !args.contains(&"--grpc-addr") {
            command.args(["--grpc-addr", "127.0.0.1:0"]);
        }
        if !args.contains(&"--admin-addr") {
            command.args(["--admin-addr", "127.0.0.1:0"]);
        }
        command.args(args).envs(env.iter().copied());
        Self::spawn(command, dir)
    }

    /// Starts the binary as envoyproxy/ratelimit's `ratelimit` (a link named
    /// so, in a directory of its own) with no arguments and `env`, which
    /// must put the listeners on free ports (`GRPC_PORT`, `PORT`, ...).
    pub fn start_as_reference(env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let program = dir.path().join("ratelimit");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tollgate"), &program).expect("link");
        let mut command = Command::new(&program);
        command.envs(env.iter().copied());
        Self::spawn(command, dir)
    }

    /// Runs `command` and waits until it listens.
    fn spawn(mut command: Command, dir: tempfile::TempDir) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("NO_COLOR", "1")
            .spawn()
            .expect("spawn tollgate");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let err_pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err_pipe).lines().map_while(Result::ok) {
                eprintln!("[tollgate] {line}");
                if let Ok(mut s) = sink.lock() {
                    s.push_str(&line);
                    s.push('\n');
                }
            }
        });
        // Lines arrive on a channel, so a child that stays silent cannot
        // hold the test past its deadline.
        let lines = stdout_lines(child.stdout.take().expect("stdout"));
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut admin = None;
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    // With --log-format json, the same lines as JSON objects.
                    let line = match serde_json::from_str::<serde_json::Value>(&line) {
                        Ok(v) if v["fields"]["listener"].is_string() => format!(
                            "tollgate: {}",
                            v["fields"]["message"].as_str().unwrap_or_default()
                        ),
                        _ => line,
                    };
                    if let Some(addr) = line.strip_prefix("tollgate: admin listening on ") {
                        admin = Some(addr.parse().expect("address"));
                    }
                    if let Some(addr) = line.strip_prefix("tollgate: gRPC listening on ") {
                        break addr.parse().expect("address");
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    panic!("tollgate did not start within 20 s");
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("tollgate exited before listening: {:?}", child.wait())
                }
            }
        };
        let admin = admin.expect("admin address printed before the gRPC one");
        // The reader thread keeps draining stdout, so the server never blocks
        // on a full pipe.
        Tollgate {
            child,
            addr,
            admin,
            dir,
            stderr,
        }
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        client_of(self.addr).await
    }

    /// The rule file the server was started on.
    pub fn rules_path(&self) -> std::path::PathBuf {
        self.dir.path().join("rules.yaml")
    }

    /// How many stderr lines so far contain `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.stderr
            .lock()
            .map(|s| s.lines().filter(|l| l.contains(needle)).count())
            .unwrap_or(0)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The admin port's `/metrics`.
    pub fn metrics(&self) -> String {
        envoy::http(self.admin, "GET", "/metrics", &[])
            .expect("metrics")
            .body
    }

    /// One sample of the admin port's `/metrics` (see [`sample`]); fails
    /// the test when it is absent.
    pub fn metric(&self, series: &str) -> u64 {
        let body = self.metrics();
        sample(&body, series).unwrap_or_else(|| panic!("{series} not in /metrics:\n{body}")) as u64
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A gRPC client of the server at `addr`.
pub async fn client_of(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to tollgate")
}

/// `rules` (YAML text) written to `rules.yaml` in a new directory, and its
/// path for `--rules` unless `args` name rules of their own (`--rules` or
/// `--rules-xds`), which replace the text.
fn rules_file(rules: &str, args: &[&str]) -> (tempfile::TempDir, Option<String>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, rules).expect("write rules");
    let own = args.contains(&"--rules") || args.contains(&"--rules-xds");
    let path = (!own).then(|| path.to_str().expect("a UTF-8 path").to_owned());
    (dir, path)
}

/// The next whole hour of the wall clock, in nanoseconds: a manual clock
/// started there has windows that line up, and expiries it sets are in
/// Redis's future.
pub fn next_whole_hour() -> u64 {
    let hour = 3_600_000_000_000u64;
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64;
    (real / hour + 1) * hour
}

/// Reads `stdout` line by line on a thread of its own.
pub fn stdout_lines(
    stdout: impl std::io::Read + Send + 'static,
) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// What a `tollgate serve` printed and how it ended.
pub struct Run {
    /// Whether it got as far as listening.
    pub started: bool,
    pub stdout: String,
    pub stderr: String,
    pub success: bool,
}

impl Run {
    /// The process refused to start, and its error names each of `naming`
    /// (the setting, the file, the variable...).
    pub fn assert_refused(&self, naming: &[&str]) {
        assert!(
            !self.started && !self.success,
            "expected a refusal naming {naming:?}; it started: {}{}",
            self.stdout,
            self.stderr
        );
        for name in naming {
            assert!(
                self.stderr.contains(name),
                "the refusal does not name {name}: {}",
                self.stderr
            );
        }
    }
}

/// Polls `done` every 20 ms until it holds; fails the test, naming `what`,
/// after `within`.
pub fn wait_until(what: &str, within: Duration, done: impl FnMut() -> bool) {
    assert!(holds_within(within, done), "{what} within {within:?}");
}

/// Polls `done` every 20 ms until it holds, for at most `within` (on this
/// thread: for tests with no runtime); whether it did.
pub fn holds_within(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `done` every 20 ms (on Tokio's clock, so other tasks run) until
/// it holds, for at most `within`; whether it did.
pub async fn eventually(within: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The one metric reader: the sample of `series` (a name with its labels
/// as `/metrics` writes them: `name` or `name{a="b"}`) in a `/metrics`
/// body; `None` when absent.
pub fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The sum of a family's samples (`name value` and `name{...} value`
/// lines) in a `/metrics` body.
pub fn metric_sum(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs `tollgate serve` on free ports with `args` and `env` until it
/// listens (then stops it with SIGTERM) or exits by itself, within 20 s.
pub fn run_briefly(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut all = vec!["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"];
    all.extend_from_slice(args);
    run_briefly_as_given(&all, env)
}

/// As [`run_briefly`], with only the arguments given (no listen addresses).
pub fn run_briefly_as_given(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    command
        .arg("serve")
        .args(["--shutdown-delay", "10ms"])
        .args(args)
        .env("NO_COLOR", "1");
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate");
    let stderr_pipe = child.stderr.take().expect("stderr");
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr_pipe), &mut text);
        text
    });
    let lines = stdout_lines(child.stdout.take().expect("stdout"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut stdout = String::new();
    let mut started = false;
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        stdout.push_str(&line);
        stdout.push('\n');
        if line.starts_with("tollgate: gRPC listening on ") {
            started = true;
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
    }
    if Instant::now() >= deadline {
        let _ = child.kill();
    }
    let status = child.wait().expect("wait");
    Run {
        started,
        stdout,
        stderr: stderr.join().unwrap_or_default(),
        success: status.success(),
    }
}

/// Fails the test, saying what to install, unless `program` runs
/// (`program --version` or `-V` succeeds).
pub fn require_program(program: &str, package: &str) {
    let runs = ["--version", "-V"].iter().any(|arg| {
        Command::new(program)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(
        runs,
        "{program} is needed by this test: install it (Debian: apt-get install {package}), or run ./scripts/test.sh, which installs it"
    );
}

/// One ShouldRateLimit call that must succeed.
pub async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("ShouldRateLimit answers")
        .into_inner()
}

/// A descriptor from `(key, value)` pairs.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request in `domain` with one descriptor per entry list.
/// A limiter request (the library's own type) of plain descriptors.
pub fn limiter_request<'a>(
    domain: &'a str,
    descriptors: &[&[(&'a str, &'a str)]],
    hits_addend: u32,
) -> tollgate::limiter::Request<'a> {
    tollgate::limiter::Request {
        domain,
        descriptors: descriptors
            .iter()
            .map(|e| tollgate::limiter::Descriptor {
                entries: e.iter().copied().collect(),
                ..tollgate::limiter::Descriptor::default()
            })
            .collect(),
        hits_addend,
    }
}

pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}
/// Writes `text` to `dir/name` as an admin token file only its owner may
/// read or write (mode 0600, as `--admin-token-file` requires); its path.
pub fn token_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write the token file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod 600");
    path.to_string_lossy().into_owned()
}

pub mod envoy;
pub mod gateway;
pub mod raw;
pub mod redis;
mod served;
pub mod tls;
pub mod upstream;
pub mod xds;

// Not every test binary serves in process.
#[allow(unused_imports)]
pub use served::Served;

/// The resident memory of process `pid`, in bytes.
pub fn rss(pid: u32) -> u64 {
    rss_if_running(pid).expect("VmRSS")
}

/// The resident memory of process `pid`, in bytes, or `None` once it has
/// exited (a process that has exited but is not yet reaped has no VmRSS).
pub fn rss_if_running(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}
