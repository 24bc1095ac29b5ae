//! Who is being limited, against a real Tollgate on each store: `/limited`
//! names exactly the clients over their limits among many that are not;
//! `/counters` shows what the next `/json` decision meets without spending;
//! `/counters/reset` restores the full limit, for a token's bearer only.

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::common::envoy::{Response, http, http_with_body};
use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{Served, Tollgate, ask, request};

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
const TOKEN: &str = "ops:0123456789abcdef0123";
const BEARER: &str = "Bearer 0123456789abcdef0123";

fn post(admin: SocketAddr, path: &str, headers: &[(&str, &str)], body: &Value) -> Response {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    http_with_body(admin, "POST", path, &all, &body.to_string()).expect("admin answers")
}

fn client_body(user: &str) -> Value {
    json!({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": user}]}]})
}

fn json_of(r: &Response) -> Value {
    serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{e}: {}", r.body))
}

async fn scenario(store: &[&str], redis: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens =
        crate::common::token_file(dir.path(), "tokens", &format!("# operators\n{TOKEN}\n"));
    let mut args = vec![
        "--admin-token-file",
        tokens.as_str(),
        "--admin-reset-max-keys",
        "1000",
    ];
    args.extend_from_slice(store);
    let server = Tollgate::start(RULES, &args);
    let mut client = server.client().await;
    // 60 clients within their limit (3 each), two over it: ann by 10 and
    // bob by 4, each request with a second descriptor the rules ignore.
    for i in 0..60 {
        let user = format!("light{i}");
        for _ in 0..3 {
            ask(
                &mut client,
                request("api", &[&[("user", &user)], &[("path", "/x")]]),
            )
            .await;
        }
    }
    for (user, n) in [("ann", 15), ("bob", 9)] {
        for _ in 0..n {
            ask(
                &mut client,
                request("api", &[&[("user", user)], &[("path", "/login")]]),
            )
            .await;
        }
    }
    let view = json_of(&http(server.admin, "GET", "/limited", &[]).expect("admin"));
    assert_eq!(view["scope"], "instance");
    let rules = view["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), 1, "{view}");
    assert_eq!(rules[0]["rule"], "api.user");
    assert_eq!(rules[0]["refused"], 14);
    let clients: Vec<(String, u64)> = rules[0]["clients"]
        .as_array()
        .expect("clients")
        .iter()
        .map(|c| {
            (
                c["descriptors"][0][0]["value"]
                    .as_str()
                    .expect("value")
                    .to_owned(),
                c["refused"].as_u64().expect("refused"),
            )
        })
        .collect();
    assert_eq!(clients, [("ann".to_owned(), 10), ("bob".to_owned(), 4)]);
    assert_eq!(
        rules[0]["clients"][0]["descriptors"][1][0],
        json!({"key": "path", "value": "/login"})
    );

    // Inspect: what is left, and the next /json decision agrees.
    let light = json_of(&post(
        server.admin,
        "/counters",
        &[],
        &client_body("light7"),
    ));
    let limit = &light["limits"][0];
    assert_eq!(
        (limit["rule"].as_str(), limit["remaining"].as_u64()),
        (Some("api.user"), Some(2)),
        "{light}"
    );
    assert_eq!(limit["used"], 3);
    assert_eq!(limit["limit"], 5);
    assert!(limit["resets_in_ms"].as_u64().expect("ms") <= 60_000);
    let again = json_of(&post(
        server.admin,
        "/counters",
        &[],
        &client_body("light7"),
    ));
    assert_eq!(
        again["limits"][0]["remaining"], 2,
        "inspecting spends nothing"
    );
    let decided = json_of(&post(server.admin, "/json", &[], &client_body("light7")));
    assert_eq!(decided["statuses"][0]["limitRemaining"], 1);
    let ann = json_of(&post(server.admin, "/counters", &[], &client_body("ann")));
    assert_eq!(ann["limits"][0]["remaining"], 0);
    assert_eq!(ann["limits"][0]["exhausted"], true);

    // Reset: refused without the token or with a wrong one.
    let none = post(server.admin, "/counters/reset", &[], &client_body("ann"));
    assert_eq!(none.status, 401, "{}", none.body);
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
    let wrong = post(
        server.admin,
        "/counters/reset",
        &[("Authorization", "Bearer 0123456789abcdef0124")],
        &client_body("ann"),
    );
    assert_eq!(wrong.status, 401);
    let reset = post(
        server.admin,
        "/counters/reset",
        &[("Authorization", BEARER)],
        &client_body("ann"),
    );
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert!(json_of(&reset)["reset"].as_u64().expect("reset") >= 1);
    let ann = json_of(&post(server.admin, "/counters", &[], &client_body("ann")));
    assert_eq!(ann["limits"][0]["remaining"], 5, "the full limit: {ann}");
    let answer = ask(&mut client, request("api", &[&[("user", "ann")]])).await;
    assert_eq!(answer.overall_code, 1, "ann is admitted again");
    assert_eq!(answer.statuses[0].limit_remaining, 4);
    // bob was not reset.
    let bob = json_of(&post(server.admin, "/counters", &[], &client_body("bob")));
    assert_eq!(bob["limits"][0]["remaining"], 0);
    // A whole rule: confirmed by its name; on Redis bounded by max_keys.
    let all = |body: Value| {
        post(
            server.admin,
            "/counters/reset",
            &[("Authorization", BEARER)],
            &body,
        )
    };
    let unconfirmed = all(json!({"domain": "api", "rule": "api.user"}));
    assert_eq!(unconfirmed.status, 400, "{}", unconfirmed.body);
    assert!(
        unconfirmed.body.contains("\"confirm\": \"api.user\""),
        "{}",
        unconfirmed.body
    );
    let unknown = all(json!({"domain": "api", "rule": "api.nope", "confirm": "api.nope"}));
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    // The body cannot raise the bound past the flag's.
    let huge =
        all(json!({"domain": "api", "rule": "api.user", "confirm": "api.user", "max_keys": 1001}));
    assert_eq!(huge.status, 400, "{}", huge.body);
    assert!(
        huge.body
            .contains("max_keys 1001 is above --admin-reset-max-keys (1000)"),
        "{}",
        huge.body
    );
    if redis {
        let bounded =
            all(json!({"domain": "api", "rule": "api.user", "confirm": "api.user", "max_keys": 1}));
        assert_eq!(bounded.status, 409, "{}", bounded.body);
        let bob = json_of(&post(server.admin, "/counters", &[], &client_body("bob")));
        assert_eq!(
            bob["limits"][0]["remaining"], 0,
            "a refused bulk reset resets nothing"
        );
    }
    let rule = all(json!({"domain": "api", "rule": "api.user", "confirm": "api.user"}));
    assert_eq!(rule.status, 200, "{}", rule.body);
    if redis {
        // bob, ann (1 hit since its reset) and the 60 light clients (twice
        // if a minute began meanwhile: the sliding window's previous one).
        let n = json_of(&rule)["reset"].as_u64().expect("a count");
        assert!((62..=124).contains(&n), "{}", rule.body);
    }
    for user in ["bob", "light7", "ann"] {
        let left = json_of(&post(server.admin, "/counters", &[], &client_body(user)));
        assert_eq!(left["limits"][0]["remaining"], 5, "{user} afresh: {left}");
    }
    // A whole domain, the same way.
    ask(&mut client, request("api", &[&[("user", "bob")]])).await;
    let domain = all(json!({"domain": "api", "confirm": "api"}));
    assert_eq!(domain.status, 200, "{}", domain.body);
    let bob = json_of(&post(server.admin, "/counters", &[], &client_body("bob")));
    assert_eq!(bob["limits"][0]["remaining"], 5, "{bob}");
    crate::common::wait_until(
        "the reset logged with who asked",
        std::time::Duration::from_secs(5),
        || {
            server.log_count("counters reset by an operator") == 3
                && server.log_count("by=\"ops\"") == 3
        },
    );
}

#[tokio::test]
async fn the_view_inspect_and_reset_on_the_memory_store() {
    scenario(&[], false).await;
}

#[tokio::test]
async fn the_view_inspect_and_reset_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    scenario(&["--store", "redis", "--redis-url", &url], true).await;
}

#[tokio::test]
async fn the_view_inspect_and_reset_on_redis_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    scenario(&["--store", "redis-cluster", "--redis-url", &urls], true).await;
}

#[tokio::test]
async fn resets_are_off_without_a_token_file() {
    let server = Served::start(RULES, &[]);
    let body = client_body("ann").to_string();
    let json = [
        ("Content-Type", "application/json"),
        ("Authorization", BEARER),
    ];
    let r = server.http("POST", "/counters/reset", &json, &body).await;
    assert_eq!(r.status, 403);
    assert!(r.body.contains("--admin-token-file"), "{}", r.body);
    // Cross-site pages cannot reach it: a body that is not JSON is refused.
    let r = server
        .http("POST", "/counters", &[("Content-Type", "text/plain")], "{}")
        .await;
    assert_eq!(r.status, 415);
}

#[test]
fn a_short_token_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = crate::common::token_file(dir.path(), "tokens", "short\n");
    let run = crate::common::run_briefly(
        &["--rules", "examples/rules", "--admin-token-file", &tokens],
        &[],
    );
    assert!(!run.success);
    assert!(
        run.stderr.contains("shorter than 16 characters"),
        "{}",
        run.stderr
    );
}

/// A refusal line a support engineer can search: at warn when asked, JSON
/// objects for the descriptors, the rule and its file:line, the request id
/// and trace id from the call's metadata (or a descriptor entry), and a
/// bound on lines per second.
#[tokio::test]
async fn refusals_are_logged_with_the_request_and_its_ids() {
    let server = Tollgate::start(
        RULES,
        &[
            "--log-format",
            "json",
            "--log-level",
            "warn",
            "--log-refusals",
            "warn",
            "--refusal-log-rate",
            "5",
        ],
    );
    let mut client = server.client().await;
    for i in 0..6 {
        let mut call =
            tonic::Request::new(request("api", &[&[("user", "ann")], &[("path", "/login")]]));
        call.metadata_mut()
            .insert("x-request-id", format!("req-{i}").parse().expect("value"));
        call.metadata_mut().insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .expect("value"),
        );
        client.should_rate_limit(call).await.expect("answer");
    }
    crate::common::wait_until(
        "the refusal line",
        std::time::Duration::from_secs(5),
        || server.log_count("req-5") == 1,
    );
    let log = server.stderr.lock().expect("log").clone();
    let line: Value = log
        .lines()
        .filter(|l| l.contains("req-5"))
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("a JSON line");
    assert_eq!(line["level"], "WARN");
    assert_eq!(line["target"], "tollgate::refusal");
    let fields = &line["fields"];
    assert_eq!(fields["rule"], "api.user");
    assert!(
        fields["source"]
            .as_str()
            .expect("source")
            .ends_with("rules.yaml:3"),
        "{fields}"
    );
    assert_eq!(fields["request_id"], "req-5");
    assert_eq!(fields["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(
        fields["descriptors"],
        json!([[{"key": "user", "value": "ann"}], [{"key": "path", "value": "/login"}]])
    );
    assert_eq!(
        fields["descriptor"],
        json!([{"key": "user", "value": "ann"}])
    );
    // A flood of 200 keys in one go: at most 5 lines a second.
    let before = server.log_count("tollgate::refusal");
    let started = std::time::Instant::now();
    for i in 0..200 {
        for _ in 0..6 {
            ask(
                &mut client,
                request("api", &[&[("user", &format!("k{i}"))]]),
            )
            .await;
        }
    }
    // Each second the flood touched (its first and last partly): 5 lines.
    let seconds = started.elapsed().as_secs() + 2;
    std::thread::sleep(std::time::Duration::from_millis(300));
    let lines = (server.log_count("tollgate::refusal") - before) as u64;
    assert!(
        (1..=5 * seconds).contains(&lines),
        "{lines} lines in {seconds} s"
    );
    assert!(server.log_count("\"not_logged\":") >= 1);
}

/// `tollgate top` in a terminal (tmux), as a person runs it: the heavy
/// client and its rule appear, and the screen refreshes.
#[tokio::test(flavor = "multi_thread")]
async fn tollgate_top_shows_the_heavy_client_in_a_terminal() {
    crate::common::require_program("tmux", "tmux");
    let server = Tollgate::start(RULES, &[]);
    let mut client = server.client().await;
    for _ in 0..12 {
        ask(
            &mut client,
            request("api", &[&[("user", "ann")], &[("path", "/login")]]),
        )
        .await;
    }
    let session = format!("tollgate-top-{}", std::process::id());
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .args(args)
            .output()
            .expect("tmux runs")
    };
    let command = format!(
        "{} top --admin http://{} --interval 300ms",
        env!("CARGO_BIN_EXE_tollgate"),
        server.admin
    );
    let started = tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "140",
        "-y",
        "30",
        &command,
    ]);
    assert!(started.status.success(), "{started:?}");
    struct Kill(String);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = std::process::Command::new("tmux")
                .args(["kill-session", "-t", &self.0])
                .output();
        }
    }
    let _kill = Kill(session.clone());
    let screen = || {
        String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout).into_owned()
    };
    crate::common::wait_until("top shows ann", std::time::Duration::from_secs(10), || {
        screen().contains("user=ann | path=/login")
    });
    let first = screen();
    assert!(first.contains("api.user (api)  7 refused"), "{first}");
    assert!(first.contains("REFUSED"), "{first}");
    // More refusals: the screen follows.
    for _ in 0..3 {
        ask(&mut client, request("api", &[&[("user", "ann")]])).await;
    }
    crate::common::wait_until("top refreshes", std::time::Duration::from_secs(10), || {
        screen().contains("api.user (api)  10 refused")
    });
}

#[test]
fn tollgate_top_names_an_admin_port_it_cannot_reach() {
    let port = crate::common::redis::free_port();
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "top",
            "--once",
            "--admin",
            &format!("http://127.0.0.1:{port}"),
        ])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        err.contains("tollgate top: http://127.0.0.1:") && err.contains("cannot connect"),
        "{err}"
    );
}

/// Two instances on one Redis: each sees its own refusals; the merged view
/// (from either) sums a client's over both.
#[tokio::test(flavor = "multi_thread")]
async fn the_merged_view_sums_the_instances_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let args = ["--store", "redis", "--redis-url", url.as_str()];
    let a = Tollgate::start(RULES, &args);
    let b = Tollgate::start(RULES, &args);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    for _ in 0..15 {
        ask(&mut ca, request("api", &[&[("user", "ann")]])).await;
    }
    for _ in 0..15 {
        ask(&mut cb, request("api", &[&[("user", "ann")]])).await;
    }
    let refused = |admin, query: &str| {
        let view = json_of(&http(admin, "GET", &format!("/limited{query}"), &[]).expect("admin"));
        (
            view["scope"].as_str().unwrap_or_default().to_owned(),
            view["rules"][0]["clients"][0]["refused"]
                .as_u64()
                .unwrap_or(0),
        )
    };
    assert_eq!(refused(a.admin, ""), ("instance".to_owned(), 10));
    assert_eq!(refused(b.admin, ""), ("instance".to_owned(), 15));
    // Each publishes every 5 s.
    crate::common::wait_until(
        "the merged view",
        std::time::Duration::from_secs(15),
        || {
            refused(a.admin, "?scope=merged") == ("merged".to_owned(), 25)
                && refused(b.admin, "?scope=merged") == ("merged".to_owned(), 25)
        },
    );
    let merged = json_of(&http(a.admin, "GET", "/limited?scope=merged", &[]).expect("admin"));
    assert_eq!(merged["instances"], 2);
    assert_eq!(merged["rules"][0]["refused"], 25);
    // `tollgate top --scope merged` shows the sum from either instance.
    let top = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["top", "--once", "--scope", "merged", "--admin"])
        .arg(format!("http://{}", b.admin))
        .output()
        .expect("runs");
    let screen = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.status.success(),
        "{screen}{}",
        String::from_utf8_lossy(&top.stderr)
    );
    assert!(
        screen.contains(", merged") && screen.contains("api.user (api)  25 refused"),
        "{screen}"
    );
    // And the page, asked for every instance (`/ui#merged`, the box ticked).
    let dom = crate::admin_browser::chromium(&format!("http://{}/ui#merged", b.admin), 4_000);
    assert!(
        dom.contains("every instance on this Redis (2 publishing)") && dom.contains("25 refused"),
        "{dom}"
    );
    // On the memory store there is nothing to merge: said so.
    let alone = Tollgate::start(RULES, &[]);
    let r = http(alone.admin, "GET", "/limited?scope=merged", &[]).expect("admin");
    assert_eq!(r.status, 400, "{}", r.body);
    let dom = crate::admin_browser::chromium(&format!("http://{}/ui#merged", alone.admin), 4_000);
    assert!(
        dom.contains("400 scope=merged needs a store"),
        "said on the page: {dom}"
    );
}

/// `--admin-reads token`: who is limited is read with a token only (the
/// page is off), and `tollgate top --token-file` reads it.
#[tokio::test(flavor = "multi_thread")]
async fn reads_can_be_closed_to_token_bearers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = crate::common::token_file(dir.path(), "tokens", &format!("{TOKEN}\n"));
    let server = Tollgate::start(
        RULES,
        &["--admin-token-file", &tokens, "--admin-reads", "token"],
    );
    let mut client = server.client().await;
    for _ in 0..7 {
        ask(&mut client, request("api", &[&[("user", "ann")]])).await;
    }
    let closed = http(server.admin, "GET", "/limited", &[]).expect("admin");
    assert_eq!(closed.status, 401, "{}", closed.body);
    let inspect = post(server.admin, "/counters", &[], &client_body("ann"));
    assert_eq!(inspect.status, 401);
    let open = http(
        server.admin,
        "GET",
        "/limited",
        &[("Authorization", BEARER)],
    )
    .expect("admin");
    assert_eq!(open.status, 200);
    assert_eq!(json_of(&open)["rules"][0]["refused"], 2);
    assert_eq!(
        http(server.admin, "GET", "/ui", &[]).expect("admin").status,
        403
    );
    let top = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "top",
            "--once",
            "--admin",
            &format!("http://{}", server.admin),
            "--token-file",
            &tokens,
        ])
        .output()
        .expect("runs");
    let out = String::from_utf8_lossy(&top.stdout);
    assert!(
        top.status.success() && out.contains("user=ann"),
        "{out}{}",
        String::from_utf8_lossy(&top.stderr)
    );
    // Without the token file, reads cannot be closed.
    let run = crate::common::run_briefly(
        &["--rules", "examples/rules", "--admin-reads", "token"],
        &[],
    );
    assert!(
        !run.success
            && run
                .stderr
                .contains("--admin-reads token needs --admin-token-file"),
        "{}",
        run.stderr
    );
}

#[tokio::test]
async fn a_token_bucket_reads_in_its_own_terms() {
    let rules = "domain: api\ndescriptors:\n  - key: key\n    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: token_bucket, burst: 20}\n";
    let server = Tollgate::start(rules, &[]);
    let body =
        json!({"domain": "api", "descriptors": [{"entries": [{"key": "key", "value": "k1"}]}]});
    // Untouched: full, nothing used (it used to say "used 40, remaining
    // 20": the refill rate taken for the capacity).
    let untouched = json_of(&post(server.admin, "/counters", &[], &body));
    let limit = &untouched["limits"][0];
    assert_eq!(limit["algorithm"], "token_bucket");
    assert_eq!(limit["capacity"], 20, "{limit}");
    assert_eq!(limit["remaining"], 20);
    assert_eq!(limit["limit"], 60, "the refill rate");
    assert_eq!(limit["next_token_in_ms"], 0);
    assert_eq!(limit["full_in_ms"], 0);
    assert!(limit.get("used").is_none(), "{limit}");
    assert!(limit.get("resets_in_ms").is_none(), "{limit}");
    let mut client = server.client().await;
    for _ in 0..3 {
        ask(&mut client, request("api", &[&[("key", "k1")]])).await;
    }
    let taken = json_of(&post(server.admin, "/counters", &[], &body));
    let limit = &taken["limits"][0];
    assert_eq!(limit["remaining"], 17, "{limit}");
    let next = limit["next_token_in_ms"].as_u64().expect("ms");
    let full = limit["full_in_ms"].as_u64().expect("ms");
    assert!(next <= 1_000, "a token a second: {limit}");
    assert!(
        (2_000..=3_000).contains(&full),
        "three tokens to refill: {limit}"
    );
}
