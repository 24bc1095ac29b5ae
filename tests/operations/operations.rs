//! Day two: hot reload (edits, invalid edits, ConfigMap symlink swaps,
//! SIGHUP), admin HTTP (/healthcheck, /json, /metrics, /rlconfig), global
//! shadow mode, refusal logs, and the settings a reference Deployment uses.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::envoy::http;
use crate::common::redis::RedisServer;
use crate::common::{Served, Tollgate, ask, client_of, eventually, metric_sum, request};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

fn rules(limit: u32) -> String {
    format!(
        "domain: ops\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n  - key: other\n    rate_limit: {{unit: hour, requests_per_unit: 100}}\n  - key: plan\n    quota_mode: true\n    rate_limits:\n      - {{name: burst, unit: minute, unit_multiplier: 5, requests_per_unit: 50}}\n      - {{name: monthly, unit: month, calendar: true, time_zone: Asia/Tokyo, requests_per_unit: 9000, budget: true}}\n"
    )
}

async fn remaining(server: SocketAddr, key: &str, value: &str) -> Option<u32> {
    let mut client = client_of(server).await;
    let r = ask(&mut client, request("ops", &[&[(key, value)]])).await;
    r.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

fn metric(server: &Tollgate, name: &str) -> f64 {
    metric_sum(&server.metrics(), name)
}

fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

#[tokio::test]
async fn a_valid_edit_is_live_within_a_second_and_counters_survive() {
    let server = Served::start(&rules(5), &[]);
    let mut client = server.client().await;
    for _ in 0..2 {
        client
            .should_rate_limit(request("ops", &[&[("other", "x")]]))
            .await
            .expect("ok");
    }
    write_atomically(&server.rules_path(), &rules(7));
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(1), async || remaining(
            server.addr,
            "user",
            "a"
        )
        .await
            == Some(7))
        .await
    );
    println!("reload took {:?}", started.elapsed());
    // `other` did not change: its counter survived (100 - 2 - this one).
    let r = ask(&mut client, request("ops", &[&[("other", "x")]])).await;
    assert_eq!(r.statuses[0].limit_remaining, 97);
    assert_eq!(
        metric_sum(
            &server.metrics().await,
            "ratelimit_service_config_load_success"
        ),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_edit_keeps_the_rules_in_force() {
    let server = Tollgate::start(&rules(5), &[]);
    let bad = [
        (
            "bad YAML",
            "domain: ops\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour\n",
        ),
        (
            "bad unit",
            "domain: ops\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
        ),
        (
            "duplicate key",
            "domain: ops\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
        ),
    ];
    for (i, (what, text)) in bad.iter().enumerate() {
        write_atomically(&server.rules_path(), text);
        let errors = (i + 1) as f64;
        assert!(
            eventually(Duration::from_secs(2), async || metric(
                &server,
                "ratelimit_service_config_load_error"
            ) == errors)
            .await,
            "{what}: the error is counted"
        );
        assert_eq!(
            remaining(server.addr, "user", "a").await,
            Some(5),
            "{what}: old rules answer"
        );
    }
    assert!(
        server.log_count("rules.yaml:4:") >= 2,
        "errors are logged with file and line"
    );
    assert!(
        server.log_count("rules.yaml:5:") >= 1,
        "the duplicate is located"
    );
    // The next valid change is picked up.
    write_atomically(&server.rules_path(), &rules(9));
    assert!(
        eventually(Duration::from_secs(1), async || remaining(
            server.addr,
            "user",
            "a"
        )
        .await
            == Some(9))
        .await
    );
}

#[tokio::test]
async fn a_configmap_symlink_swap_reloads_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    // The layout kubelet makes: rules.yaml -> ..data/rules.yaml, ..data -> ..2026_1.
    std::fs::create_dir(d.join("..2026_1")).expect("mkdir");
    std::fs::write(d.join("..2026_1/rules.yaml"), rules(5)).expect("write");
    std::os::unix::fs::symlink("..2026_1", d.join("..data")).expect("symlink");
    std::os::unix::fs::symlink("..data/rules.yaml", d.join("rules.yaml")).expect("symlink");
    let dir_arg = d.to_str().expect("utf-8 path").to_owned();
    let server = Served::start(&rules(1), &["--rules", &dir_arg]);
    assert_eq!(
        remaining(server.addr, "user", "a").await,
        Some(5),
        "the directory's rules are used"
    );
    std::fs::create_dir(d.join("..2026_2")).expect("mkdir");
    std::fs::write(d.join("..2026_2/rules.yaml"), rules(8)).expect("write");
    std::os::unix::fs::symlink("..2026_2", d.join("..data_tmp")).expect("symlink");
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).expect("atomic swap");
    std::fs::remove_dir_all(d.join("..2026_1")).expect("old version removed");
    assert!(
        eventually(Duration::from_secs(1), async || remaining(
            server.addr,
            "user",
            "a"
        )
        .await
            == Some(8))
        .await
    );
    // A later edit, once live, shows that every look at the swap is done:
    // start, the swap once, the edit.
    std::fs::write(d.join("..2026_2/rules.yaml"), rules(9)).expect("write");
    assert!(
        eventually(Duration::from_secs(2), async || remaining(
            server.addr,
            "user",
            "a"
        )
        .await
            == Some(9))
        .await
    );
    assert_eq!(
        metric_sum(
            &server.metrics().await,
            "ratelimit_service_config_load_success"
        ),
        3.0,
        "start + the swap once + the edit"
    );
    assert_eq!(
        metric_sum(
            &server.metrics().await,
            "ratelimit_service_config_load_error"
        ),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads() {
    let server = Tollgate::start(&rules(5), &["--watch-rules", "off"]);
    write_atomically(&server.rules_path(), &rules(6));
    let hup = Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    assert!(
        eventually(Duration::from_secs(1), async || remaining(
            server.addr,
            "user",
            "a"
        )
        .await
            == Some(6))
        .await
    );
    // Exactly two loads (start, SIGHUP): nothing watched the file.
    assert_eq!(
        metric(&server, "ratelimit_service_config_load_success"),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn healthcheck_reports_a_store_outage_and_fails_while_shutting_down() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let mut server = Tollgate::start(
        &rules(5),
        &[
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-timeout",
            "50ms",
            "--shutdown-delay",
            "2s",
        ],
    );
    assert_eq!(
        http(server.admin, "GET", "/healthcheck", &[])
            .expect("answer")
            .status,
        200
    );
    redis.kill();
    // Failure modes still answer every rule as written: stay in rotation,
    // and say the store is down.
    let down = http(server.admin, "GET", "/healthcheck", &[]).expect("answer");
    assert_eq!(down.status, 200);
    assert!(
        down.body.contains("degraded") && down.body.contains("store"),
        "{}",
        down.body
    );
    redis.restart();
    assert!(
        eventually(Duration::from_secs(3), async || http(
            server.admin,
            "GET",
            "/healthcheck",
            &[]
        )
        .is_ok_and(|r| r.status == 200))
        .await
    );

    let term = Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    assert!(
        eventually(Duration::from_secs(1), async || http(
            server.admin,
            "GET",
            "/healthcheck",
            &[]
        )
        .is_ok_and(|r| r.status == 500 && r.body.contains("shutting down")))
        .await,
        "still answering while draining, and unhealthy"
    );
    assert!(
        server.child.try_wait().expect("wait").is_none(),
        "not exited yet"
    );
    let exit = server.child.wait().expect("wait");
    assert!(exit.success());
}

#[tokio::test]
async fn json_answers_200_429_and_400() {
    let server = Served::start(&rules(1), &[]);
    let body = r#"{"domain":"ops","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}"#;
    let json = [("Content-Type", "application/json")];
    let ok = server.http("POST", "/json", &json, body).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let v: serde_json::Value = serde_json::from_str(&ok.body).expect("JSON");
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    let over = server.http("POST", "/json", &json, body).await;
    assert_eq!(over.status, 429);
    assert!(over.body.contains("OVER_LIMIT"));
    for bad in [
        "{",
        r#"{"domain":"ops","descriptors":[{"entries":[{"key":"user","value":"j","extra":1}]}]}"#,
        r#"{"domain":"","descriptors":[]}"#,
    ] {
        let r = server.http("POST", "/json", &json, bad).await;
        assert_eq!(r.status, 400, "{bad}");
        assert!(!r.body.trim().is_empty(), "a reason is given");
    }
    let config = server.http("GET", "/rlconfig", &[], "").await;
    for line in [
        "ops.user: 1 per hour",
        "ops.plan: 50 per 5minute (sliding_window), name burst, quota mode",
        "ops.plan: 9000 per month@Asia/Tokyo (fixed_window, budget), name monthly, quota mode",
    ] {
        assert!(config.body.contains(line), "{line} in {}", config.body);
    }
}

/// The metric names listed in the metrics page's tables (docs/metrics.md).
fn documented_metrics() -> Vec<String> {
    metrics_where(|_| true)
}

/// The metrics docs/metrics.md marks (`--data-dir`): only a server with a
/// data directory has them (tests/operations/durable.rs checks them).
pub(crate) fn data_dir_metrics() -> Vec<String> {
    metrics_where(|row| row.contains("(`--data-dir`)"))
}

/// docs/metrics.md's metric names whose table row `keep` accepts.
fn metrics_where(keep: impl Fn(&str) -> bool) -> Vec<String> {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
            .expect("docs/metrics.md");
    page.lines()
        .filter(|l| keep(l))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

/// examples/prometheus/alerts.yaml: every alert has a severity, a summary
/// and a description, queries only metrics Tollgate documents (so serves:
/// see the test below), passes `promtool check rules`, and fires on the
/// series of examples/prometheus/alerts_test.yaml (`promtool test rules`)
/// and not on healthy ones.
#[test]
fn the_alert_rules_are_valid_name_served_metrics_and_fire_when_they_should() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/prometheus");
    let text = std::fs::read_to_string(dir.join("alerts.yaml")).expect("alerts.yaml");
    let rules: serde_json::Value = serde_saphyr::from_str(&text).expect("YAML");
    let documented = documented_metrics();
    let names = regex::Regex::new(r"\b((?:tollgate|ratelimit)_[a-z0-9_]+)").expect("pattern");
    let mut alerts = Vec::new();
    for group in rules["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let alert = rule["alert"].as_str().expect("an alert name");
            alerts.push(alert.to_owned());
            for field in [
                &rule["labels"]["severity"],
                &rule["annotations"]["summary"],
                &rule["annotations"]["description"],
            ] {
                assert!(
                    field.as_str().is_some_and(|s| !s.is_empty()),
                    "{alert}: {rule}"
                );
            }
            let expr = rule["expr"].as_str().expect("an expression");
            for name in names.captures_iter(expr).map(|c| c[1].to_owned()) {
                assert!(
                    documented.contains(&name),
                    "{alert} queries {name}, which docs/metrics.md does not list"
                );
            }
        }
    }
    for wanted in [
        "TollgateStoreUnavailable",
        "TollgateRefusalsSpiking",
        "TollgateRuleReloadFailing",
    ] {
        assert!(alerts.iter().any(|a| a == wanted), "{wanted} in {alerts:?}");
    }
    let promtool = |args: &[&str]| {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap_or_else(|e| {
                panic!("promtool checks the alert rules: install it (Debian: apt-get install prometheus; scripts/test.sh does): {e}")
            });
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "promtool {args:?}: {said}");
        said
    };
    let checked = promtool(&["check", "rules", "alerts.yaml"]);
    assert!(
        checked.contains(&format!("{} rules found", alerts.len())),
        "{checked}"
    );
    promtool(&["test", "rules", "alerts_test.yaml"]);
}

/// The metric names examples/grafana/tollgate.json queries: every name
/// followed by a `{job=...}` selector in a panel's expression.
fn dashboard_metrics() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/grafana/tollgate.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("dashboard")).expect("JSON");
    let pattern = regex::Regex::new(r"([a-z_:][a-z0-9_:]*)\{job=").expect("pattern");
    let mut names: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .flat_map(|expr| {
            pattern
                .captures_iter(&expr)
                .map(|c| c[1].to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_in_the_readme_and_the_dashboard_appears_after_traffic() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let text = "domain: ops\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: watch\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    // Candidate rules, for the tollgate_candidate_* series.
    let dir = tempfile::tempdir().expect("tempdir");
    let candidate = dir.path().join("candidate.yaml");
    std::fs::write(
        &candidate,
        "domain: ops\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .expect("candidate rules");
    let candidate = candidate.display().to_string();
    let server = Tollgate::start(
        text,
        &[
            "--candidate-rules",
            &candidate,
            "--store",
            "redis",
            "--redis-url",
            &url,
            "--redis-timeout",
            "30ms",
            "--redis-breaker",
            "2",
        ],
    );
    let mut client = server.client().await;
    for _ in 0..4 {
        let _ = client
            .should_rate_limit(request("ops", &[&[("user", "m")], &[("watch", "w")]]))
            .await;
    }
    let _ = client.should_rate_limit(request("", &[])).await;
    // One quota (RLQS) report, for the tollgate_rlqs_* series.
    let mut quotas = RateLimitQuotaServiceClient::connect(format!("http://{}", server.addr))
        .await
        .expect("connect");
    let report = RateLimitQuotaUsageReports {
        domain: "ops".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("user".to_string(), "q".to_string())]
                    .into_iter()
                    .collect(),
            }),
            time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: 5,
                nanos: 0,
            }),
            num_requests_allowed: 3,
            num_requests_denied: 1,
        }],
    };
    let mut answers = quotas
        .stream_rate_limit_quotas(futures_util::stream::iter(vec![report]))
        .await
        .expect("stream")
        .into_inner();
    let answer = answers.message().await.expect("answer").expect("one");
    assert_eq!(answer.bucket_action.len(), 1);
    // A descriptor no rule matches (tollgate_unmatched_descriptors_total).
    let _ = client
        .should_rate_limit(request("ops", &[&[("no-such-key", "x")]]))
        .await;
    redis.kill();
    for _ in 0..4 {
        let _ = client
            .should_rate_limit(request("ops", &[&[("user", "n")]]))
            .await;
    }
    let body = server.metrics();
    let names = documented_metrics();
    assert!(
        names.len() >= 15,
        "docs/metrics.md lists the metrics: {names:?}"
    );
    // A data directory's own are checked with one (durable.rs).
    let data = data_dir_metrics();
    for name in names.iter().filter(|n| !data.contains(n)) {
        assert!(
            body.lines().any(|l| l.starts_with(name.as_str())),
            "{name} missing from /metrics"
        );
    }
    // Every series the Grafana dashboard queries is there too.
    let queried = dashboard_metrics();
    assert!(queried.len() >= 20, "the dashboard's queries: {queried:?}");
    for name in &queried {
        assert!(
            body.lines()
                .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))),
            "{name}, queried by examples/grafana/tollgate.json, missing from /metrics"
        );
    }
    assert!(
        body.contains(r#"ratelimit_service_rate_limit_over_limit{domain="ops",key1="user"} 2"#),
        "{body}"
    );
    // watch (limit 1) was over on 3 of 4 calls, two of them in calls the user limit refused.
    assert!(
        body.contains(r#"ratelimit_service_rate_limit_shadow_mode{domain="ops",key1="watch"} 3"#),
        "{body}"
    );
    assert!(
        !body.contains("key1=\"user_m\""),
        "request values stay out of labels without detailed_metric"
    );
}

#[tokio::test]
async fn global_shadow_mode_reports_ok_and_counts() {
    let server = Served::start(&rules(1), &["--shadow-mode"]);
    let mut client = server.client().await;
    for _ in 0..3 {
        let r = ask(&mut client, request("ops", &[&[("user", "s")]])).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    let body = server.metrics().await;
    assert_eq!(
        metric_sum(&body, "ratelimit_service_rate_limit_shadow_mode"),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_refusals_logs_one_line_per_key_and_second() {
    let server = Tollgate::start(&rules(1), &[]);
    let mut client = server.client().await;
    for _ in 0..50 {
        let _ = client
            .should_rate_limit(request("ops", &[&[("user", "flood")]]))
            .await;
    }
    let _ = client
        .should_rate_limit(request("ops", &[&[("user", "other")]]))
        .await;
    let _ = client
        .should_rate_limit(request("ops", &[&[("user", "other")]]))
        .await;
    // A last refusal of a third key: once its line is in, every earlier
    // line is too (stderr is one ordered stream).
    for _ in 0..2 {
        let _ = client
            .should_rate_limit(request("ops", &[&[("user", "marker")]]))
            .await;
    }
    assert!(
        eventually(Duration::from_secs(5), async || server
            .log_count("\"marker\"")
            == 1)
        .await
    );
    // One line each for flood, other and marker; the 50 calls may straddle
    // a second, which allows flood one more.
    let lines = server.log_count("over the limit");
    assert!((3..=4).contains(&lines), "{lines} lines");
    let flood = server.log_count("\"flood\"");
    assert!((1..=2).contains(&flood), "{flood} lines for one key");
}

#[test]
fn settings_from_a_reference_deployment_are_honoured_and_mistakes_stop_start_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("current/ratelimit/config")).expect("mkdir");
    std::fs::write(dir.path().join("current/ratelimit/config/r.yaml"), rules(3)).expect("write");
    let root = dir.path().join("current");
    let root = root.to_str().expect("utf-8 path").to_owned();
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let mut env = env.to_vec();
        env.extend([
            ("RUNTIME_ROOT", root.as_str()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ]);
        let run = crate::common::run_briefly_as_given(args, &env);
        (run.stdout, run.stderr)
    };
    let grpc = crate::common::redis::free_port().to_string();
    let port = crate::common::redis::free_port().to_string();
    let (stdout, stderr) = run(
        &[
            ("GRPC_PORT", &grpc),
            ("GRPC_HOST", "127.0.0.1"),
            ("PORT", &port),
            ("HOST", "127.0.0.1"),
            ("LOG_LEVEL", "debug"),
            ("SHADOW_MODE", "false"),
            ("QUOTA_MODE", "true"),
        ],
        &[],
    );
    assert!(
        stdout.contains(&format!("gRPC listening on 127.0.0.1:{grpc}")),
        "{stdout}{stderr}"
    );
    assert!(
        stdout.contains(&format!("admin listening on 127.0.0.1:{port}")),
        "{stdout}{stderr}"
    );
    assert!(
        stderr.contains("rules=4"),
        "rules from RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config: {stderr}"
    );

    let (_, stderr) = run(&[("TOLLGATE_GRPC_ADDRES", "127.0.0.1:1")], &[]);
    assert!(
        stderr.contains("unknown setting(s) TOLLGATE_GRPC_ADDRES"),
        "{stderr}"
    );
    let (_, stderr) = run(&[("REDIS_URL", "127.0.0.1:6379")], &["--store", "memory"]);
    assert!(stderr.contains("contradicts --store"), "{stderr}");
    let (_, stderr) = run(&[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "x:1")], &[]);
    assert!(stderr.contains("REDIS_TYPE=sentinel"), "{stderr}");
    let (_, stderr) = run(&[("SHADOW_MODE", "maybe")], &[]);
    assert!(stderr.contains("SHADOW_MODE=maybe"), "{stderr}");
    let (_, stderr) = run(&[("QUOTA_MODE", "maybe")], &[]);
    assert!(stderr.contains("QUOTA_MODE=maybe"), "{stderr}");
}
