//! The container image `scripts/image.sh` builds from `Containerfile`, run
//! with buildah (`--isolation chroot`, vfs storage) as its non-root user:
//! what it contains, `tollgate --version`, the example rules under the
//! image's default command, and `/bin/ratelimit` started exactly as Envoy
//! Gateway's rate limit Deployment starts it.
//!
//! Building the image takes minutes, so these tests are ignored in the
//! default run; `./scripts/image.sh` builds it and then runs them
//! (`cargo test --test operations -- --ignored image::`). They need root (buildah's
//! chroot isolation).

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::envoy::{http, http_with_body};
use crate::common::gateway::{Deployment, Gateway, borrowed};
use crate::common::redis::{RedisServer, free_port};
use crate::common::tls::{client_config, tls_call};
use tollgate::test_util::{RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit};

const IMAGE: &str = concat!("ghcr.io/tollgate/tollgate:", env!("CARGO_PKG_VERSION"));
/// The runtime base's `nonroot`.
const NONROOT: u32 = 65532;
/// The image with its base, uncompressed. distroless/cc is ~24 MB and the
/// release binary ~15 MB: far past this bound means something (a shell, a
/// toolchain, a debug build) came along.
const MAX_IMAGE_BYTES: u64 = 64 * 1024 * 1024;

fn archive() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".build/tollgate-image.tar")
}

/// `buildah` with the storage image.sh uses.
fn buildah(args: &[&str]) -> Output {
    Command::new("buildah")
        .arg("--storage-driver")
        .arg("vfs")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run buildah ({e}): install it (apt-get install buildah) and run ./scripts/image.sh")
        })
}

fn ok(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Loads the image from `.build/tollgate-image.tar` (the archive is what
/// image.sh delivers, so the tests run what it wrote, not a leftover tag).
fn load_image() {
    let archive = archive();
    assert!(
        archive.exists(),
        "{} is missing: run ./scripts/image.sh first",
        archive.display()
    );
    let source = format!("oci-archive:{}", archive.display());
    ok(
        buildah(&["pull", "--quiet", &source]),
        "buildah pull the archive",
    );
    let loaded = ok(
        buildah(&["images", "--format", "{{.Name}}:{{.Tag}}"]),
        "images",
    );
    assert!(
        loaded.lines().any(|l| l == IMAGE),
        "{IMAGE} not in {loaded}"
    );
}

/// A working container of the image, removed on drop.
struct Container(String);

impl Container {
    fn new() -> Self {
        load_image();
        let name = ok(
            buildah(&["from", "--pull=never", "--quiet", IMAGE]),
            "buildah from",
        );
        Container(name.trim().to_owned())
    }

    /// Runs `command` in the container as the image's user, to its end.
    fn run(&self, command: &[&str]) -> Output {
        let mut args = vec!["run", "--isolation", "chroot", &self.0, "--"];
        args.extend_from_slice(command);
        buildah(&args)
    }

    /// Starts `command` in the container with `env` and `volumes`
    /// (`host:container:ro`), in a process group of its own.
    fn spawn(&self, command: &[&str], env: &[(&str, &str)], volumes: &[String]) -> Running {
        let mut cmd = Command::new("buildah");
        cmd.args(["--storage-driver", "vfs", "run", "--isolation", "chroot"]);
        for (k, v) in env {
            cmd.arg("--env").arg(format!("{k}={v}"));
        }
        for volume in volumes {
            cmd.arg("--volume").arg(volume);
        }
        cmd.arg(&self.0).arg("--").args(command);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("buildah run");
        Running(child)
    }

    /// The container's root file system, mounted.
    fn mount(&self) -> PathBuf {
        PathBuf::from(ok(buildah(&["mount", &self.0]), "buildah mount").trim())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = buildah(&["umount", &self.0]);
        let _ = buildah(&["rm", &self.0]);
    }
}

/// A `buildah run` in the background; its process group is ended on drop.
struct Running(Child);

impl Running {
    /// The pid of the process in the container whose command line starts
    /// with `program` (a descendant of buildah, in its process group).
    fn pid_of(&self, program: &str) -> Option<u32> {
        let group = self.0.id();
        std::fs::read_dir("/proc")
            .ok()?
            .flatten()
            .find_map(|entry| {
                let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // Field 5 (after the parenthesized name) is the process group.
                let after = &stat[stat.rfind(')')? + 2..];
                let pgrp: u32 = after.split(' ').nth(2)?.parse().ok()?;
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                let argv0 = cmdline.split(|b| *b == 0).next()?;
                (pgrp == group && argv0 == program.as_bytes()).then_some(pid)
            })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.wait();
    }
}

/// The uid a process runs as (`Uid:` of /proc/PID/status, the real one).
fn uid_of(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .expect("a Uid line")
}

/// Polls `GET path` on `addr` until it answers 200.
fn wait_healthy(addr: SocketAddr, path: &str, running: &mut Running) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = http(addr, "GET", path, &[])
            && r.status == 200
        {
            return;
        }
        if let Ok(Some(status)) = running.0.try_wait() {
            panic!("the container exited before {path} answered: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{path} on {addr} did not answer 200 within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn git_commit() -> String {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Every path under `root` (not following links).
fn walk(root: &Path, out: &mut Vec<PathBuf>) {
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            let path = entry.path();
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            out.push(path.clone());
            if is_dir {
                walk(&path, out);
            }
        }
    }
}

#[test]
#[ignore = "needs the image: ./scripts/image.sh builds it and runs these"]
fn the_image_is_small_has_no_shell_and_says_what_it_is() {
    let container = Container::new();
    let inspect: serde_json::Value = serde_json::from_str(&ok(
        buildah(&["inspect", "--type", "image", IMAGE]),
        "inspect",
    ))
    .expect("inspect JSON");
    let config = &inspect["OCIv1"]["config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert_eq!(config["Entrypoint"], serde_json::json!(["/bin/tollgate"]));
    for port in ["8081/tcp", "6070/tcp", "8080/tcp"] {
        assert!(
            config["ExposedPorts"].get(port).is_some(),
            "EXPOSE {port}: {config}"
        );
    }
    let labels = &config["Labels"];
    let commit = git_commit();
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(labels["org.opencontainers.image.revision"], commit.as_str());
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert!(
        labels["org.opencontainers.image.source"].is_string(),
        "{labels}"
    );

    // The version and commit, as the image's user.
    let version = ok(container.run(&["/bin/tollgate", "--version"]), "--version");
    assert_eq!(
        version.trim(),
        format!("tollgate {} (commit {commit})", env!("CARGO_PKG_VERSION"))
    );

    // What is in it: the binary, its link, the rules, CA certificates; no
    // shell and no package manager.
    let root = container.mount();
    let link = std::fs::read_link(root.join("bin/ratelimit")).expect("/bin/ratelimit is a link");
    assert_eq!(link, Path::new("tollgate"));
    assert!(root.join("etc/tollgate/rules/api.yaml").is_file());
    let bundle = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt"))
        .expect("CA certificates");
    assert!(bundle.matches("BEGIN CERTIFICATE").count() > 50);
    let mut paths = Vec::new();
    walk(&root, &mut paths);
    let forbidden = [
        "sh", "bash", "dash", "busybox", "apt", "apt-get", "dpkg", "su", "sudo",
    ];
    let found: Vec<_> = paths
        .iter()
        .filter(|p| !p.is_dir())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| forbidden.contains(&n))
        })
        .collect();
    assert!(found.is_empty(), "a shell or package manager: {found:?}");
    assert!(
        !container.run(&["/bin/sh", "-c", "true"]).status.success(),
        "/bin/sh ran"
    );

    let size: u64 = paths
        .iter()
        .filter_map(|p| std::fs::symlink_metadata(p).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    let archive_size = std::fs::metadata(archive()).expect("archive").len();
    eprintln!(
        "image {IMAGE}: {:.1} MB of files, archive {:.1} MB",
        size as f64 / 1e6,
        archive_size as f64 / 1e6
    );
    assert!(size < MAX_IMAGE_BYTES, "{size} bytes");
}

#[test]
#[ignore = "needs the image: ./scripts/image.sh builds it and runs these"]
fn the_default_command_serves_the_example_rules_as_nonroot() {
    let container = Container::new();
    let (grpc, admin) = (free_port(), free_port());
    let grpc_addr = format!("127.0.0.1:{grpc}");
    let admin_addr = format!("127.0.0.1:{admin}");
    // The image's CMD, with the addresses moved to free ports on the host's
    // network (chroot isolation shares it).
    let mut running = container.spawn(
        &[
            "/bin/tollgate",
            "serve",
            "--rules",
            "/etc/tollgate/rules",
            "--grpc-addr",
            &grpc_addr,
            "--admin-addr",
            &admin_addr,
        ],
        &[],
        &[],
    );
    let admin = SocketAddr::from(([127, 0, 0, 1], admin));
    wait_healthy(admin, "/healthcheck", &mut running);
    let pid = running
        .pid_of("/bin/tollgate")
        .expect("the server's process");
    assert_eq!(uid_of(pid), NONROOT, "runs as nonroot");

    // examples/rules/api.yaml: the request the README's first example sends.
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#;
    let answer = http_with_body(
        admin,
        "POST",
        "/json",
        &[("content-type", "application/json")],
        body,
    )
    .expect("/json");
    assert_eq!(answer.status, 200, "{answer:?}");
    let decision: serde_json::Value = serde_json::from_str(&answer.body).expect("JSON");
    assert_eq!(decision["overallCode"], "OK", "{decision}");
    let metrics = http(admin, "GET", "/metrics", &[]).expect("metrics").body;
    let commit = git_commit();
    assert!(
        metrics.contains(&format!("commit=\"{commit}\"")),
        "tollgate_build_info carries the commit: {metrics}"
    );
}

fn gateway_rules() -> Vec<RateLimitConfig> {
    vec![RateLimitConfig {
        name: "default/eg/httproute/api".into(),
        domain: "t".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Hour as i32,
                requests_per_unit: 2,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }]
}

/// Copies `from` to `dir/name`, readable by the image's user (a Secret
/// volume's defaultMode 0644).
fn install(from: &str, dir: &Path, name: &str) {
    use std::os::unix::fs::PermissionsExt;
    let to = dir.join(name);
    std::fs::copy(from, &to).expect("copy");
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644)).expect("chmod");
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the image: ./scripts/image.sh builds it and runs these"]
async fn envoy_gateways_deployment_runs_the_image() {
    use std::os::unix::fs::PermissionsExt;
    let container = Container::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let gateway = Gateway::start(dir.path()).await;
    let pki = &gateway.pki;
    let redis = RedisServer::start();
    // Envoy Gateway mounts the `envoy-rate-limit` secret at /certs.
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).expect("certs dir");
    install(&pki.path("ratelimit"), &certs, "tls.crt");
    install(&pki.key_path("ratelimit"), &certs, "tls.key");
    install(&pki.path("ca"), &certs, "ca.crt");
    for d in [dir.path(), certs.as_path()] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let deployment = Deployment::new(
        &gateway,
        format!("127.0.0.1:{}", redis.port),
        ["/certs/tls.crt", "/certs/tls.key", "/certs/ca.crt"].map(String::from),
        "/data".into(),
    );
    let (grpc, http_port) = (deployment.grpc_port, deployment.http_port);
    let mut env = deployment.env();
    env.push(("USE_PROMETHEUS", "false".to_owned()));
    let env = borrowed(&env);
    let volumes = [format!("{}:/certs:ro", certs.display())];
    // `/bin/ratelimit`, no arguments, as the image's user.
    let mut running = container.spawn(&["/bin/ratelimit"], &env, &volumes);
    let probe = SocketAddr::from(([127, 0, 0, 1], http_port));
    wait_healthy(probe, "/healthcheck", &mut running);
    let pid = running
        .pid_of("/bin/ratelimit")
        .expect("the server's process");
    assert_eq!(uid_of(pid), NONROOT, "runs as nonroot");

    let xds = &gateway.xds;
    let hello = xds
        .wait_for("the first request", |s| s.node_id.is_some())
        .await;
    assert_eq!(hello.node_id.as_deref(), Some("envoy-ratelimit"));
    xds.set("1", gateway_rules());
    xds.wait_for("the ACK", |s| s.version_info == "1").await;
    let server = SocketAddr::from(([127, 0, 0, 1], grpc));
    let mut codes = Vec::new();
    for _ in 0..3 {
        let answer = tls_call(server, client_config(pki, "ca", None))
            .await
            .expect("gRPC over TLS");
        codes.push(answer.overall_code);
    }
    assert_eq!(codes, [1, 1, 2], "OK, OK, OVER_LIMIT");
    assert!(
        !redis.cli(&["--scan"]).trim().is_empty(),
        "counters in Redis"
    );
}
