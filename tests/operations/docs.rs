//! The documentation runs: the README's quick start and "Try it through
//! Envoy" are executed exactly as written (a real `tollgate serve`, a real
//! Envoy, curl), their printed output compared with what the README shows;
//! every Envoy configuration in the docs passes `envoy --mode validate`; every
//! rule file in them passes `tollgate check`; every relative link and anchor
//! resolves; every page is in the book's table of contents.
//!
//! Markers in the Markdown (HTML comments, invisible when rendered) say what
//! a block is for:
//! - `<!-- docs-test: background, ready at URL -->`: a command that keeps
//!   running (a server), started in the background; the next block runs once
//!   URL answers 200;
//! - `<!-- docs-test: run -->`: a command run to its end, which must succeed;
//! - `<!-- docs-test: output -->`: what the command before printed, line by
//!   line, `...` standing for text that changes from run to run;
//! - `<!-- docs-test: rules -->`: a rule file.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::envoy::{envoy_binary, validate_path};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A fenced code block, with the marker comment just above it, if any.
#[derive(Debug)]
struct Block {
    file: String,
    line: usize,
    lang: String,
    marker: Option<String>,
    text: String,
}

/// The fenced blocks of a Markdown text (indented fences included: a block
/// inside a list item).
fn blocks(file: &str, markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = markdown.lines().enumerate().peekable();
    let mut marker: Option<String> = None;
    while let Some((n, line)) = lines.next() {
        let trimmed = line.trim_start();
        if let Some(m) = trimmed
            .strip_prefix("<!-- docs-test:")
            .and_then(|m| m.strip_suffix("-->"))
        {
            marker = Some(m.trim().to_string());
            continue;
        }
        let Some(lang) = trimmed.strip_prefix("```") else {
            if !trimmed.is_empty() {
                marker = None;
            }
            continue;
        };
        let indent = line.len() - trimmed.len();
        let mut text = String::new();
        for (_, body) in lines.by_ref() {
            if body.trim_start().starts_with("```") {
                break;
            }
            text.push_str(body.get(indent..).unwrap_or(body.trim_start()));
            text.push('\n');
        }
        out.push(Block {
            file: file.to_string(),
            line: n + 1,
            lang: lang.trim().to_string(),
            marker: marker.take(),
            text,
        });
    }
    out
}

/// README.md and every page under docs/, as (path relative to the root, text).
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(root().join(&n)).expect("read page");
            (n, text)
        })
        .collect()
}

/// `line` matches `pattern`, where `...` in the pattern stands for any text.
fn matches(pattern: &str, line: &str) -> bool {
    let mut parts = pattern.split("...");
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// The servers a walk-through started, ended with it.
struct Background(Vec<(String, Child)>);

impl Drop for Background {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            // The whole process group: the shell and what it started.
            let _ = Command::new("kill")
                .arg("--")
                .arg(format!("-{}", child.id()))
                .status();
            let _ = child.wait();
        }
    }
}

/// PATH with the binaries the README names first: `tollgate` (this build) and
/// `envoy` (the tests' Envoy).
fn path_with_binaries() -> String {
    let tollgate = Path::new(env!("CARGO_BIN_EXE_tollgate"))
        .parent()
        .expect("a directory")
        .to_path_buf();
    let bin = tempfile::Builder::new()
        .prefix("tollgate-docs-bin")
        .tempdir()
        .expect("tempdir")
        .keep();
    std::os::unix::fs::symlink(envoy_binary(), bin.join("envoy")).expect("link envoy");
    format!(
        "{}:{}:{}",
        tollgate.display(),
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

fn shell(text: &str, path: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(text)
        .current_dir(root())
        .env("PATH", path)
        .env_remove("TOLLGATE_RULES");
    cmd
}

fn http_ok(url: &str) -> bool {
    Command::new("curl")
        .args(["-sf", "-o", "/dev/null", "--max-time", "1", url])
        .status()
        .is_ok_and(|s| s.success())
}

fn ports_free(ports: &[u16]) {
    for port in ports {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok(),
            "the README's walk-through uses port {port}, which something else listens on: stop it and run again"
        );
    }
}

/// Runs the command blocks of `sections` of `readme` in order, as a person
/// would type them: servers in the background, the rest to their end with
/// their output compared. Returns how many blocks ran.
fn walk_through(readme: &str, sections: &[&str]) -> usize {
    let path = path_with_binaries();
    let mut servers = Background(Vec::new());
    let mut ran = 0;
    let mut last_output: Option<(String, String)> = None;
    for section in sections {
        let heading = format!("\n## {section}\n");
        let start = readme
            .find(&heading)
            .unwrap_or_else(|| panic!("the README has a section {section:?}"))
            + heading.len();
        let body = readme[start..].split("\n## ").next().unwrap_or("");
        // Block lines are counted from the section; the README's are wanted.
        let offset = readme[..start].lines().count();
        for block in blocks("README.md", body) {
            let where_ = format!("README.md:{} ({section:?})", block.line + offset);
            let marker = block.marker.as_deref().unwrap_or_else(|| {
                panic!(
                    "{where_}: every block of this section is tested; mark it (see tests/operations/docs.rs)"
                )
            });
            if let Some(url) = marker.strip_prefix("background, ready at ") {
                let log = tempfile::NamedTempFile::new().expect("a log file");
                let mut child = shell(&block.text, &path)
                    .stdout(Stdio::null())
                    .stderr(log.reopen().expect("the log file"))
                    .process_group(0)
                    .spawn()
                    .expect("start the block");
                let started = Instant::now();
                while !http_ok(url) {
                    if let Some(status) = child.try_wait().expect("poll") {
                        let err = std::fs::read_to_string(log.path()).unwrap_or_default();
                        panic!("{where_}: `{}` exited ({status}): {err}", block.text.trim());
                    }
                    assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "{where_}: {url} did not answer within 30 s"
                    );
                    std::thread::sleep(Duration::from_millis(50));
                }
                servers.0.push((block.text.clone(), child));
            } else if marker == "run" {
                let out = shell(&block.text, &path).output().expect("run the block");
                let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
                assert!(
                    out.status.success(),
                    "{where_}: `{}` failed ({}): {stdout}{}",
                    block.text.trim(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
                last_output = Some((where_, stdout));
            } else if marker == "output" {
                let (ran_at, actual) = last_output
                    .take()
                    .unwrap_or_else(|| panic!("{where_}: an output block follows a run block"));
                let expected: Vec<&str> = block.text.lines().collect();
                let got: Vec<&str> = actual.lines().map(str::trim_end).collect();
                let same = expected.len() == got.len()
                    && expected.iter().zip(&got).all(|(e, g)| matches(e, g));
                assert!(
                    same,
                    "{ran_at} printed\n{actual}\nbut the README shows\n{}",
                    block.text
                );
            } else {
                panic!("{where_}: unknown marker {marker:?}");
            }
            ran += 1;
        }
    }
    ran
}

#[test]
fn the_quick_start_and_the_envoy_walk_through_run_as_written() {
    ports_free(&[8081, 6070, 10000, 10001, 9901]);
    // The example limit is ten a minute in a sliding window: a loop that
    // crosses a minute boundary has part of its hits weighed as the previous
    // minute's and may see one more admitted (as the README says). The whole
    // walk-through takes a few seconds: start it early in a minute.
    let second = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        % 60;
    if second > 40 {
        std::thread::sleep(Duration::from_secs(61 - second));
    }
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let ran = walk_through(&readme, &["Quick start", "Try it through Envoy"]);
    assert!(ran >= 8, "every block ran: {ran}");
}

#[test]
fn output_patterns_match_only_what_they_say() {
    assert!(matches("200 200 429", "200 200 429"));
    assert!(!matches("200 200 429", "200 200 200"));
    assert!(matches("retry-after: ...", "retry-after: 42"));
    assert!(matches(r#"r=0;t=..."#, "r=0;t=17"));
    assert!(!matches("r=0;t=...", "r=1;t=17"));
    assert!(matches("a...b...c", "a--b--c"));
    assert!(!matches("a...b...c", "a--c--b"));
    assert!(!matches("abc", "abcd"));
}

#[test]
fn every_rule_file_in_the_docs_passes_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut checked = 0;
    for (name, text) in pages() {
        for block in blocks(&name, &text) {
            if block.marker.as_deref() != Some("rules") {
                continue;
            }
            let file = dir.path().join(format!("rules-{checked}.yaml"));
            std::fs::write(&file, &block.text).expect("write");
            let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
                .arg("check")
                .arg(&file)
                .output()
                .expect("run check");
            assert!(
                out.status.success(),
                "{}:{}: the rules do not load: {}",
                block.file,
                block.line,
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked >= 1, "the README's first rule is checked");
}

/// A YAML block is an Envoy configuration when it names Envoy's filters or
/// types and is not a Kubernetes resource (an Istio EnvoyFilter, say).
fn is_envoy_config(block: &Block) -> bool {
    block.lang == "yaml"
        && (block.text.contains("envoy.filters.") || block.text.contains("googleapis.com/envoy"))
        && !block.text.contains("\nkind:")
        && !block.text.starts_with("kind:")
        && !block.text.starts_with("apiVersion:")
}

#[test]
fn every_envoy_configuration_in_the_docs_is_one_envoy_accepts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut validated = 0;
    for (name, text) in pages() {
        for block in blocks(&name, &text).iter().filter(|b| is_envoy_config(b)) {
            let file = dir.path().join(format!("envoy-{validated}.yaml"));
            std::fs::write(&file, &block.text).expect("write");
            let (ok, output) = validate_path(&file);
            assert!(
                ok,
                "{}:{}: envoy --mode validate refuses this configuration:\n{output}",
                block.file, block.line
            );
            validated += 1;
        }
    }
    assert!(
        validated >= 1,
        "the docs' Envoy configurations: {validated}"
    );
}

/// The anchors of a page: GitHub's and mdBook's slugs of its headings.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        out.insert(slug);
    }
    out
}

/// The `[text](target)` links of a Markdown text outside code, with their lines.
fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    for (n, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((n + 1, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_link_between_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for (name, text) in pages() {
        let dir = root().join(&name).parent().expect("a folder").to_path_buf();
        for (line, target) in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path: PathBuf = if file.is_empty() {
                root().join(&name)
            } else {
                dir.join(file)
            };
            checked += 1;
            if !path.exists() {
                broken.push(format!("{name}:{line}: {target}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor {
                let page = std::fs::read_to_string(&path).unwrap_or_default();
                if !anchors(&page).contains(anchor) {
                    broken.push(format!("{name}:{line}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked >= 30, "the docs link to each other: {checked}");
}

#[test]
fn every_page_is_in_the_book() {
    let summary = std::fs::read_to_string(root().join("docs/SUMMARY.md")).expect("SUMMARY.md");
    let listed: BTreeSet<String> = links(&summary).into_iter().map(|(_, t)| t).collect();
    for (name, _) in pages() {
        let Some(page) = name.strip_prefix("docs/") else {
            continue;
        };
        if page == "SUMMARY.md" {
            continue;
        }
        assert!(
            listed.contains(page),
            "docs/{page} is not in docs/SUMMARY.md"
        );
    }
}

#[test]
fn the_readme_stays_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(
        lines <= 320,
        "the README is {lines} lines: it is a newcomer's five minutes; move detail to docs/"
    );
}

/// Every source file docs/ARCHITECTURE.md names (`` `store/redis/pool.rs` ``,
/// or `` `pool.rs` `` where the text is about one folder) is a file under
/// `src/`: the map does not name rooms that are gone.
#[test]
fn every_file_the_architecture_names_exists() {
    let page = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("the page");
    let mut files = Vec::new();
    let mut stack = vec![root().join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("a folder").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(rel) = path.strip_prefix(root().join("src")) {
                files.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    let mut named = Vec::new();
    let mut missing = Vec::new();
    for (i, part) in page.split('`').enumerate() {
        // Inside backticks, and a file name (a folder ends with `/`).
        let name = part.trim_end_matches('/');
        let file = name.ends_with(".rs") || name.ends_with(".lua");
        if i % 2 == 1 && !name.contains(' ') && (file || part.ends_with('/')) {
            named.push(name.to_owned());
            let found = root().join(name).exists()
                || files.iter().any(|f| {
                    f == name
                        || f.ends_with(&format!("/{name}"))
                        || (!file
                            && (f.starts_with(&format!("{name}/"))
                                || f.contains(&format!("/{name}/"))))
                });
            if !found {
                missing.push(name.to_owned());
            }
        }
    }
    // The diagram names files too (outside backticks): `RedisStore mod.rs`.
    for word in page.split_whitespace() {
        let word =
            word.trim_matches(|c: char| !c.is_alphanumeric() && c != '.' && c != '_' && c != '/');
        if (word.ends_with(".rs") || word.ends_with(".lua")) && !named.iter().any(|n| n == word) {
            named.push(word.to_owned());
            if !root().join(word).exists()
                && !files
                    .iter()
                    .any(|f| f == word || f.ends_with(&format!("/{word}")))
            {
                missing.push(word.to_owned());
            }
        }
    }
    assert!(named.len() > 30, "the names are read: {named:?}");
    assert!(
        missing.is_empty(),
        "docs/ARCHITECTURE.md names files that do not exist: {missing:?}"
    );
}
