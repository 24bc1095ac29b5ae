//! The admin port against a real browser (headless Chromium): a page from
//! another origin that POSTs to `/json` cannot spend anyone's budget, and a
//! page on a rebound host name cannot read the admin endpoints.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use crate::common::envoy::http;
use crate::common::{Served, Tollgate, ask, eventually, request};

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 1}\n";

/// Serves `page` to every request on a free port, in the background.
fn serve_page(page: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    port
}

/// Opens `url` in headless Chromium and returns the page's DOM once its
/// scripts have had `budget_ms` of (virtual) time.
pub(crate) fn chromium(url: &str, budget_ms: u32) -> String {
    crate::common::require_program("chromium", "chromium");
    let profile = tempfile::tempdir().expect("profile dir");
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .args(["--dump-dom", url])
        .output()
        .expect("run chromium");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_from_another_origin_cannot_spend_a_budget() {
    let server = Tollgate::start(RULES, &[]);
    let admin = server.admin;
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#;
    // The classic JSON CSRF: text/plain needs no CORS preflight, from fetch
    // (no-cors) and from a form whose one field spells the JSON.
    let page = format!(
        r#"<html><body><iframe name="sink"></iframe>
<form id="f" method="POST" action="http://{admin}/json" enctype="text/plain" target="sink">
<input name='{{"domain":"d","descriptors":[{{"entries":[{{"key":"user","value":"ann"}}]}}],"pad":"' value='"}}'>
</form>
<div id="out">pending</div>
<script>
fetch("http://{admin}/json", {{method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}}, body: '{body}'}})
  .then(() => {{ document.getElementById("out").textContent = "fetch sent"; document.getElementById("f").submit(); }})
  .catch(e => {{ document.getElementById("out").textContent = "fetch failed " + e; document.getElementById("f").submit(); }});
</script></body></html>"#
    );
    let port = serve_page(page);
    let dom = chromium(&format!("http://127.0.0.1:{port}/"), 5000);
    assert!(dom.contains("fetch sent"), "the page ran: {dom}");
    // Ann's one request a day is still hers.
    let mut client = server.client().await;
    let ann = ask(&mut client, request("d", &[&[("user", "ann")]])).await;
    assert_eq!(
        ann.overall_code, 1,
        "ann's budget was not spent by the page"
    );
    // Both requests reached the admin port and were refused.
    let refused = eventually(Duration::from_secs(5), async || {
        server.metric("tollgate_admin_refused_total") >= 2
    })
    .await;
    assert!(
        refused,
        "the browser's requests were refused: {} seen",
        server.metric("tollgate_admin_refused_total")
    );
}

#[tokio::test]
async fn requests_naming_another_host_and_cross_site_posts_are_refused() {
    let server = Served::start(RULES, &["--admin-hosts", "tollgate.example"]);
    let admin = server.admin;
    // DNS rebinding: the browser sends the attacker's name as Host.
    let rebound = server
        .http("GET", "/rlconfig", &[("Host", "evil.example:6070")], "")
        .await;
    assert_eq!(rebound.status, 421, "{}", rebound.body);
    assert!(rebound.body.contains("--admin-hosts"), "{}", rebound.body);
    for host in [
        admin.to_string(),
        "localhost".into(),
        "Tollgate.Example:6070".into(),
    ] {
        let r = server
            .http("GET", "/rlconfig", &[("Host", &host)], "")
            .await;
        assert_eq!(r.status, 200, "{host}: {}", r.body);
    }
    // A cross-site POST, even as JSON (a preflight the browser would send
    // first is never answered with CORS headers anyway).
    let json = [
        ("Content-Type", "application/json"),
        ("Origin", "http://evil.example"),
    ];
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#;
    let r = server.http("POST", "/json", &json, body).await;
    assert_eq!(r.status, 403, "{}", r.body);
    let plain = [("Content-Type", "text/plain")];
    let r = server.http("POST", "/json", &plain, body).await;
    assert_eq!(r.status, 415, "{}", r.body);
    // The operator's own call (curl sends no Origin) works, and spends.
    let ok = [("Content-Type", "application/json")];
    let r = server.http("POST", "/json", &ok, body).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(server.metric("tollgate_admin_refused_total").await, 3);
}

#[tokio::test]
async fn json_can_be_turned_off() {
    let server = Served::start(RULES, &["--admin-json", "off"]);
    let ok = [("Content-Type", "application/json")];
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#;
    let r = server.http("POST", "/json", &ok, body).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(r.body.contains("--admin-json off"), "{}", r.body);
}

/// The admin page as a person sees it: the heavy client and its rule, the
/// rules in force and the store's health, read from the DOM after its
/// script ran in Chromium; a client value that is HTML stays text; the page
/// loads nothing from elsewhere and says so in its policy.
#[tokio::test(flavor = "multi_thread")]
async fn the_admin_page_shows_who_is_limited() {
    let server = Tollgate::start(RULES, &[]);
    let mut client = server.client().await;
    for _ in 0..10 {
        ask(
            &mut client,
            request("d", &[&[("user", "ann")], &[("path", "/login")]]),
        )
        .await;
    }
    let html = "<img src=x onerror=\"document.title='owned'\">";
    for _ in 0..3 {
        ask(&mut client, request("d", &[&[("user", html)]])).await;
    }
    let page = http(server.admin, "GET", "/ui", &[]).expect("page");
    assert_eq!(page.status, 200);
    let csp = page.header("content-security-policy").expect("a policy");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert!(
        !page.body.contains("http://") && !page.body.contains("https://"),
        "no external asset"
    );
    assert!(!page.body.contains("<script>"), "no inline script");
    let dom = chromium(&format!("http://{}/ui", server.admin), 4_000);
    assert!(dom.contains("d.user"), "the rule: {dom}");
    assert!(
        dom.contains("user=ann | path=/login"),
        "the heavy client and its request: {dom}"
    );
    assert!(dom.contains("store: OK"), "the store's health: {dom}");
    assert!(
        dom.contains("rate_limit") || dom.contains("d.user:"),
        "the rules in force: {dom}"
    );
    assert!(
        dom.contains("user=&lt;img src=x"),
        "HTML from a client is text: {dom}"
    );
    assert!(!dom.contains("<title>owned"), "and never runs");
    // One client's counters, asked in the address as a person can bookmark
    // it: the page POSTs /counters (same origin) and shows what is left.
    let dom = chromium(
        &format!("http://{}/ui#inspect=d:user=ann", server.admin),
        4_000,
    );
    assert!(dom.contains("<th>when</th>"), "the counters table: {dom}");
    assert!(
        dom.contains(r#"<td class="n">1 per day</td>"#),
        "ann's limit: {dom}"
    );
    assert!(
        dom.contains(r#"<td class="n">0 of 1 (1 used)</td><td class="n">resets in "#),
        "a window in its terms: used 1, remaining 0: {dom}"
    );
    // A browser asking /limited for HTML is sent to the page.
    let limited =
        http(server.admin, "GET", "/limited", &[("Accept", "text/html")]).expect("limited");
    assert_eq!(
        (limited.status, limited.header("location")),
        (303, Some("/ui"))
    );
}

/// What does not show as itself (a bidi override, a zero-width space, a
/// terminal escape) is shown escaped on the page, as `\u{..}`; an address
/// whose `#inspect=` is not valid percent-encoding is said so, and the rest
/// of the page still runs.
#[tokio::test(flavor = "multi_thread")]
async fn the_admin_page_escapes_invisible_characters_and_survives_a_bad_address() {
    let server = Tollgate::start(RULES, &[]);
    let mut client = server.client().await;
    for _ in 0..3 {
        ask(
            &mut client,
            request("d", &[&[("user", "eve\u{202e}nimda\u{200b}\u{1b}[2J")]]),
        )
        .await;
    }
    let dom = chromium(
        &format!("http://{}/ui#inspect=%E0%A4%A", server.admin),
        4_000,
    );
    assert!(
        dom.contains(r"user=eve\u{202e}nimda\u{200b}\u{1b}[2J"),
        "escaped: {dom}"
    );
    assert!(
        !dom.contains('\u{202e}') && !dom.contains('\u{200b}') && !dom.contains('\u{1b}'),
        "never raw: {dom}"
    );
    assert!(
        dom.contains("not valid percent-encoding"),
        "the bad address is said so: {dom}"
    );
}
