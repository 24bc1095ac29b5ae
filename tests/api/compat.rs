//! Rule files written for envoyproxy/ratelimit load and match here unchanged:
//! which files load, which are refused and what the error names, and which
//! limit each descriptor gets. Two corpora in one format: the repository's own
//! (`tests/compat/`, always checked) and the reference's own fixtures
//! (`../shared/compat/envoy-ratelimit/` beside the checkout), checked where
//! they are and reported as skipped where they are not.

// Test code: a failed expectation is a failed test.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tollgate::rules::{LoadOptions, RuleErrors, RuleSet, load_paths};

#[derive(Deserialize)]
struct Cases {
    errors: Vec<ErrorCase>,
    ok: Vec<OkCase>,
}

#[derive(Deserialize)]
struct ErrorCase {
    files: Vec<String>,
    must_mention: Vec<String>,
    /// What the reference prints (the reference's corpus only).
    #[allow(dead_code)]
    reference_message: Option<String>,
}

#[derive(Deserialize)]
struct OkCase {
    files: Vec<String>,
    #[serde(default)]
    merge_domains: bool,
    domain: String,
    lookups: Vec<Lookup>,
}

#[derive(Deserialize)]
struct Lookup {
    domain: Option<String>,
    descriptor: Vec<(String, String)>,
    expect: Expect,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Expect {
    Word(String),
    Limit {
        requests_per_unit: u32,
        unit: String,
        name: Option<String>,
        shadow_mode: Option<bool>,
    },
}

/// A folder holding `cases.yaml` and the `configs/` it names.
struct Corpus {
    dir: PathBuf,
    cases: Cases,
}

impl Corpus {
    fn read(dir: PathBuf) -> Corpus {
        let path = dir.join("cases.yaml");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let cases = serde_saphyr::from_str(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        Corpus { dir, cases }
    }

    fn load(&self, files: &[String], merge_domains: bool) -> Result<RuleSet, RuleErrors> {
        let paths: Vec<PathBuf> = files
            .iter()
            .map(|f| self.dir.join("configs").join(f))
            .collect();
        load_paths(
            &paths,
            &LoadOptions {
                merge_domains,
                ..LoadOptions::default()
            },
        )
    }
}

/// The repository's own corpus, and the reference's where it is present.
fn corpora() -> Vec<Corpus> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = vec![Corpus::read(root.join("tests/compat"))];
    let reference = root.join("../shared/compat/envoy-ratelimit");
    if reference.join("cases.yaml").is_file() {
        all.push(Corpus::read(reference));
    } else {
        eprintln!(
            "compat: skipped envoyproxy/ratelimit's own fixtures: not found at {} \
             (the repository's own corpus, tests/compat/, covers the same behaviours)",
            reference.display()
        );
    }
    all
}

#[test]
fn every_error_case_is_refused_naming_the_file_and_the_problem() {
    for corpus in corpora() {
        check_errors(&corpus);
    }
}

fn check_errors(corpus: &Corpus) {
    let cases = &corpus.cases;
    assert!(
        cases.errors.len() >= 14,
        "the corpus lists every refused file"
    );
    for case in &cases.errors {
        let err = match corpus.load(&case.files, false) {
            Ok(_) => panic!("{:?} must be refused", case.files),
            Err(e) => e.to_string(),
        };
        let last = case.files.last().expect("a case names files");
        assert!(
            err.contains(last.as_str()),
            "{:?}: error must name the file: {err}",
            case.files
        );
        for word in &case.must_mention {
            assert!(
                err.contains(word.as_str()),
                "{:?}: error must mention {word:?}: {err}",
                case.files
            );
        }
        // Where the problem is inside the file, the error gives line and column.
        if case.files.len() == 1 && case.files[0] != "bad_yaml.yaml" {
            let located = format!("{last}:");
            let after = &err[err.find(&located).expect("file named") + located.len()..];
            assert!(
                after
                    .split(':')
                    .next()
                    .is_some_and(|l| l.parse::<u32>().is_ok()),
                "{last}: error should carry a line number: {err}"
            );
        }
    }
}

#[test]
fn every_ok_case_loads_and_matches_as_the_reference() {
    for corpus in corpora() {
        check_ok(&corpus);
    }
}

fn check_ok(corpus: &Corpus) {
    let cases = &corpus.cases;
    assert!(cases.ok.len() >= 4, "the corpus lists the loading cases");
    for case in &cases.ok {
        let rules = corpus
            .load(&case.files, case.merge_domains)
            .unwrap_or_else(|e| panic!("{:?} must load: {e}", case.files));
        for lookup in &case.lookups {
            let domain = lookup.domain.as_deref().unwrap_or(&case.domain);
            let entries: Vec<(&str, &str)> = lookup
                .descriptor
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let found = rules.lookup(domain, &entries);
            let what = format!("{:?} {domain} {:?}", case.files, lookup.descriptor);
            match &lookup.expect {
                Expect::Word(w) if w == "none" => {
                    assert!(found.is_none(), "{what}: expected no limit, got {found:?}")
                }
                Expect::Word(w) if w == "unlimited" => {
                    let found = found.unwrap_or_else(|| panic!("{what}: expected unlimited"));
                    assert_eq!(found.rules.len(), 1, "{what}: one rate_limit");
                    let rule = &found.rules[0];
                    assert!(
                        rule.limit.is_none(),
                        "{what}: expected unlimited, got {rule}"
                    );
                }
                Expect::Word(w) => panic!("unknown expectation {w}"),
                Expect::Limit {
                    requests_per_unit,
                    unit,
                    name,
                    shadow_mode,
                } => {
                    let found = found.unwrap_or_else(|| panic!("{what}: expected a limit"));
                    assert_eq!(found.rules.len(), 1, "{what}: one rate_limit");
                    let rule = &found.rules[0];
                    let limit = rule
                        .limit
                        .unwrap_or_else(|| panic!("{what}: got unlimited"));
                    assert_eq!(limit.requests_per_unit, *requests_per_unit, "{what}");
                    assert!(
                        limit.unit.name().eq_ignore_ascii_case(unit),
                        "{what}: unit {:?}",
                        limit.unit
                    );
                    if let Some(name) = name {
                        assert_eq!(rule.name.as_deref(), Some(name.as_str()), "{what}");
                    }
                    if let Some(shadow) = shadow_mode {
                        assert_eq!(rule.shadow_mode, *shadow, "{what}");
                    }
                }
            }
        }
    }
}
