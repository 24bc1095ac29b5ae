//! What a new user trips over on the command line (issue 22, item 6): a
//! pipe closed early, JSON logs with plain lines in them, a default rules
//! path that only exists in the checkout, and `check` passing what `serve`
//! will not be ready with.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");
const RULES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/rules");

#[test]
fn check_into_a_pipe_closed_early_ends_quietly() {
    // `tollgate check ... | head -1`: the reader goes after one line, long
    // before the output (far more than a pipe holds) is written.
    let dir = tempfile::tempdir().expect("dir");
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    for i in 0..5000 {
        yaml.push_str(&format!(
            "  - key: k\n    value: v{i}\n    rate_limit: {{unit: minute, requests_per_unit: 10}}\n"
        ));
    }
    std::fs::write(dir.path().join("many.yaml"), yaml).expect("write");
    let mut child = Command::new(BIN)
        .arg("check")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("a first byte");
    drop(stdout);
    let out = child.wait_with_output().expect("ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
}

#[test]
fn check_refuses_a_directory_without_rules_as_serve_would_not_be_ready() {
    let empty = tempfile::tempdir().expect("dir");
    let out = Command::new(BIN)
        .arg("check")
        .arg(empty.path())
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no rules in"), "{stderr}");
    assert!(stderr.contains("not be ready"), "{stderr}");
}

#[test]
fn serve_outside_the_checkout_says_where_the_default_rules_path_points() {
    let elsewhere = tempfile::tempdir().expect("dir");
    let out = Command::new(BIN)
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .current_dir(elsewhere.path())
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("examples/rules"), "{stderr}");
    assert!(stderr.contains("no --rules given"), "{stderr}");
    assert!(stderr.contains("--rules PATH"), "{stderr}");
}

#[test]
fn json_logs_have_no_plain_lines() {
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--rules",
            RULES,
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    let mut stdout = child.stdout.take().expect("stdout");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    while !text.contains("gRPC listening") && Instant::now() < deadline {
        match stdout.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
    }
    let _ = child.kill();
    let out = child.wait_with_output().expect("ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("gRPC listening"), "{text}\n{stderr}");
    for line in text.lines().chain(stderr.lines()).filter(|l| !l.is_empty()) {
        let parsed: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(parsed["fields"]["message"].is_string(), "{line}");
    }
    let admin = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["listener"] == "admin")
        .expect("the admin line");
    assert!(
        admin["fields"]["addr"]
            .as_str()
            .is_some_and(|a| a.starts_with("127.0.0.1:")),
        "{admin}"
    );
}

#[test]
fn check_warns_that_envoy_cannot_show_a_window_of_several_units() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(
        dir.path().join("r.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, unit_multiplier: 10, requests_per_unit: 100}\n",
    )
    .expect("write");
    let out = Command::new(BIN)
        .arg("check")
        .arg(dir.path())
        .output()
        .expect("run");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("w=60 where the window is 600 s"),
        "{stderr}"
    );
}

#[test]
fn simulate_takes_the_rule_files_spelling_of_algorithms() {
    let out = Command::new(BIN)
        .args([
            "simulate",
            "--rules",
            RULES,
            "--generate",
            "rate=10,seconds=5",
            "--algorithm",
            "fixed_window",
        ])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("fixed"),
        "{stderr}"
    );
}

#[test]
fn simulate_refuses_a_generator_spec_past_its_bounds_before_running() {
    for spec in ["rate=1e308,seconds=1e-307", "clients=0", "start=1e11"] {
        let out = Command::new(BIN)
            .args(["simulate", "--rules", RULES, "--generate", spec])
            .output()
            .expect("run");
        assert!(!out.status.success(), "{spec}");
    }
    // Generated beside a traffic file, it is held, and bounded.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("traffic.jsonl");
    std::fs::write(
        &file,
        "{\"timestamp\":1767225600,\"domain\":\"api\",\"descriptors\":[]}\n",
    )
    .expect("write");
    let out = Command::new(BIN)
        .args([
            "simulate",
            "--rules",
            RULES,
            "--generate",
            "rate=1000,seconds=100",
        ])
        .args(["--max-events", "5000", "--traffic"])
        .arg(&file)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--max-events"), "{stderr}");
}

const ENVOY: &str = r#"
static_resources:
  listeners:
    - filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                access_log:
                  - name: envoy.access_loggers.file
                    typed_config:
                      log_format:
                        text_format_source:
                          inline_string: "%START_TIME% %REQ(:PATH)% %REQ(X-API-KEY)%\n"
                route_config:
                  virtual_hosts:
                    - name: api
                      domains: ["*"]
                      routes:
                        - match: { prefix: / }
                          route:
                            cluster: api
                            rate_limits:
                              - actions:
                                  - request_headers: { header_name: x-api-key, descriptor_key: api_key }
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: api
"#;

#[test]
fn when_no_line_imports_the_error_says_why() {
    let dir = tempfile::tempdir().expect("dir");
    let (config, log) = (dir.path().join("envoy.yaml"), dir.path().join("access.log"));
    std::fs::write(&config, ENVOY).expect("write");
    std::fs::write(&log, "this is not an access log line\nnor this\n").expect("write");
    let out = Command::new(BIN)
        .args(["simulate", "--rules", RULES])
        .arg("--traffic")
        .arg(&log)
        .arg("--envoy-config")
        .arg(&config)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("the traffic given had none"), "{stderr}");
    assert!(
        stderr.contains("lines do not follow the access log format"),
        "{stderr}"
    );
}

#[test]
fn requests_the_server_would_refuse_are_counted_not_dropped_silently() {
    let dir = tempfile::tempdir().expect("dir");
    let traffic = dir.path().join("t.jsonl");
    let many: Vec<String> = (0..200)
        .map(|i| format!(r#"{{"entries":[{{"key":"user","value":"u{i}"}}]}}"#))
        .collect();
    let lines = format!(
        "{{\"timestamp\":1767225600,\"domain\":\"api\",\"descriptors\":[{{\"entries\":[{{\"key\":\"user\",\"value\":\"ann\"}}]}}]}}\n{{\"timestamp\":1767225601,\"domain\":\"api\",\"descriptors\":[{}]}}\n",
        many.join(",")
    );
    std::fs::write(&traffic, lines).expect("write");
    let out = Command::new(BIN)
        .args(["simulate", "--rules", RULES])
        .arg("--traffic")
        .arg(&traffic)
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 requests not replayed"), "{stdout}");
    assert!(stdout.contains("--max-descriptors"), "{stdout}");
}

#[test]
fn check_against_the_rules_in_force_warns_about_counters_that_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    std::fs::create_dir_all(&old).expect("dir");
    std::fs::create_dir_all(&new).expect("dir");
    std::fs::write(
        old.join("r.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5, calendar: true, time_zone: Europe/Berlin}\n",
    )
    .expect("write");
    std::fs::write(
        new.join("r.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5, calendar: true, time_zone: Asia/Tokyo}\n",
    )
    .expect("write");
    let out = Command::new(BIN)
        .arg("check")
        .arg(&new)
        .arg("--against")
        .arg(&old)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("d.k") && stderr.contains("start from zero"),
        "{stderr}"
    );
}

#[test]
fn version_names_the_commit_and_metrics_the_build() {
    let out = Command::new(BIN).arg("--version").output().expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    assert!(
        text.starts_with(&format!("tollgate {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    if let Some(commit) = commit {
        assert!(text.contains(&commit), "{text} names {commit}");
    }
}

/// A log level that is no level would silence every line (the filter takes
/// it for a target name): refused at start-up, naming it; the reference's
/// `LOG_LEVEL=warning` is its warn.
#[test]
fn a_misspelt_log_level_is_refused_and_the_references_spellings_accepted() {
    let run = crate::common::run_briefly(&["--log-level", "verbose"], &[]);
    assert!(!run.started && !run.success, "{}", run.stderr);
    assert!(
        run.stderr.contains("'verbose' is not a log level"),
        "{}",
        run.stderr
    );
    let run = crate::common::run_briefly(&[], &[("LOG_LEVEL", "verbose")]);
    assert!(!run.started, "{}", run.stderr);
    assert!(run.stderr.contains("LOG_LEVEL=verbose"), "{}", run.stderr);
    let run = crate::common::run_briefly(&[], &[("LOG_LEVEL", "warning")]);
    assert!(run.started, "{}", run.stderr);
}

/// `check --envoy-config`: the shipped pair agrees; a key Envoy never sends
/// (`apikey` for `api_key`) is an error naming the rule's line and the keys
/// Envoy sends, and the descriptor left unlimited is a warning naming the
/// route; the flags turn either into the other.
#[test]
fn check_against_an_envoy_configuration_names_what_the_two_sides_miss() {
    let root = env!("CARGO_MANIFEST_DIR");
    let envoy = format!("{root}/envoy/gateway.yaml");
    let check = |rules: &str, more: &[&str]| {
        let out = Command::new(BIN)
            .args(["check", rules, "--envoy-config", &envoy])
            .args(more)
            .output()
            .expect("run");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stderr) = check(&format!("{RULES}/gateway.yaml"), &[]);
    assert!(ok && !stderr.contains("warning"), "{stderr}");
    let dir = tempfile::tempdir().expect("dir");
    let shipped = std::fs::read_to_string(format!("{RULES}/gateway.yaml")).expect("rules");
    assert!(shipped.contains("key: api_key"));
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, shipped.replace("key: api_key", "key: apikey")).expect("write");
    let broken = broken.to_string_lossy().into_owned();
    let line = shipped
        .lines()
        .position(|l| l.contains("key: api_key"))
        .expect("a line")
        + 1;
    let (ok, stderr) = check(&broken, &[]);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: {broken}:{line}: rule gateway.plan_free.apikey limits nothing"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("plan.api_key"),
        "the keys Envoy sends: {stderr}"
    );
    assert!(
        stderr.contains("warning: ") && stderr.contains("sends [plan=*, api_key=*]"),
        "{stderr}"
    );
    let (ok, stderr) = check(&broken, &["--unreached-rules", "warning"]);
    assert!(ok, "{stderr}");
    let (ok, stderr) = check(
        &format!("{RULES}/gateway.yaml"),
        &["--unlimited-descriptors", "error"],
    );
    assert!(ok, "nothing unlimited in the shipped pair: {stderr}");
    let (ok, stderr) = check(
        &broken,
        &[
            "--unreached-rules",
            "warning",
            "--unlimited-descriptors",
            "error",
        ],
    );
    assert!(!ok, "{stderr}");
    let out = Command::new(BIN)
        .args([
            "check",
            &format!("{RULES}/gateway.yaml"),
            "--envoy-config",
            "/nonexistent.yaml",
        ])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("/nonexistent.yaml"),
        "{stderr}"
    );
}
