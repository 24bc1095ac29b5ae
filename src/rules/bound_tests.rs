//! Rule files written wrong, too large or too deep: the errors say what to
//! change and where, and each bound names its flag.

use std::path::PathBuf;

use super::tests::limit_of;
use super::*;

fn load(text: &str) -> Result<RuleSet, RuleErrors> {
    RuleSet::from_yaml(text)
}

/// The parser's own wording (its option names, its budget's debug form)
/// never reaches a rule file's author: each error says what to change.
#[test]
fn rule_errors_say_what_to_change_in_the_file() {
    let error = |text: &str| load(text).expect_err("refused").to_string();

    let twice = error(
        "domain: a\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 1}\n    value: w\n",
    );
    assert!(
        twice.contains(":6:5:")
            && twice.contains("`value` is given twice in one mapping (first on line 4)"),
        "{twice}"
    );
    assert!(!twice.contains("DuplicateKeyPolicy"), "{twice}");

    let map = error(
        "domain: a\ndescriptors:\n  - key: k\n    rate_limits:\n      unit: second\n      requests_per_unit: 1\n",
    );
    assert!(
        map.contains("`rate_limits` must be a list") && map.contains("write `rate_limit:`"),
        "{map}"
    );

    let duplicate = error(
        "domain: a\ndescriptors:\n  - key: k\n    value: v\n  - key: x\n  - key: k\n    value: v\n",
    );
    assert!(
        duplicate.contains(":6:5:") && duplicate.contains("'a.k_v': declared first at line 3"),
        "{duplicate}"
    );
}

#[test]
fn the_node_budget_is_a_bound_with_its_flag_and_large_files_load() {
    let mut text = String::from("domain: d\ndescriptors:\n");
    for i in 0..30_000 {
        text.push_str(&format!(
            "  - key: customer\n    value: c{i}\n    rate_limit: {{unit: minute, requests_per_unit: {}}}\n",
            i % 100 + 1
        ));
    }
    // 30,000 per-customer rules: past the YAML library's own default budget
    // (250,000 nodes), well within ours.
    let rules = load(&text).expect("a large file loads");
    assert_eq!(limit_of(&rules, &[("customer", "c29999")]), Some(100));

    let small = LoadOptions {
        max_rule_nodes: 10_000,
        ..LoadOptions::default()
    };
    let refused = load_sources(&[(PathBuf::from("big.yaml"), text)], &small)
        .expect_err("over the bound")
        .to_string();
    assert!(
        refused.contains("more than 10000 YAML nodes (--max-rule-nodes"),
        "{refused}"
    );
    assert!(!refused.contains("budget breached"), "{refused}");
}

/// One rule, one line: a value or a name with a newline (from a file or a
/// control plane) cannot forge a line of `tollgate check` or `/rlconfig`.
#[test]
fn control_characters_in_rules_are_escaped_in_their_lines() {
    let rules = load(
        "domain: d\ndescriptors:\n  - key: k\n    value: \"x\\nforged: 1 per second\"\n    rate_limit: {unit: second, requests_per_unit: 1, name: \"a\\u001b[2Jb\"}\n",
    )
    .expect("loads");
    let text = rules.to_string();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains("d.k_x\\nforged"), "{text}");
    assert!(text.contains("name a\\u{1b}[2Jb"), "{text}");
    assert_eq!(printable("plain é"), "plain é");
}

/// Nesting is a bound with its flag: up to --max-rule-depth loads (here on
/// a test thread's 2 MiB stack, as a reload's blocking thread has), and past
/// it the error names the bound, not the YAML library.
#[test]
fn deep_nesting_loads_up_to_its_named_bound() {
    let levels = DEFAULT_MAX_RULE_DEPTH;
    let mut text = String::from("domain: d\ndescriptors:\n");
    for level in 0..levels - 1 {
        let indent = "  ".repeat(2 * level + 1);
        text.push_str(&format!(
            "{indent}- key: k{level}\n{indent}  descriptors:\n"
        ));
    }
    let indent = "  ".repeat(2 * (levels - 1) + 1);
    text.push_str(&format!(
        "{indent}- key: last\n{indent}  rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    ));
    let rules = load(&text).expect("the default depth loads");
    assert_eq!(rules.rules().len(), 1);
    let shallow = LoadOptions {
        max_rule_depth: levels - 1,
        ..LoadOptions::default()
    };
    let refused = load_sources(&[(PathBuf::from("deep.yaml"), text)], &shallow)
        .expect_err("past the bound")
        .to_string();
    assert!(
        refused.contains(&format!(
            "nested more than {} deep (--max-rule-depth)",
            levels - 1
        )),
        "{refused}"
    );
    // A hostile file far deeper is refused as soon as the parser gets there,
    // on this same 2 MiB stack: never a stack overflow.
    let mut hostile = String::from("domain: d\ndescriptors:\n");
    for level in 0..500 {
        let indent = " ".repeat(2 * level + 1);
        hostile.push_str(&format!("{indent}- key: k\n{indent}  descriptors:\n"));
    }
    let refused = load(&hostile).expect_err("refused").to_string();
    assert!(refused.contains("--max-rule-depth"), "{refused}");
}

#[test]
fn an_empty_descriptors_list_and_a_bare_descriptor_load_with_warnings() {
    // The indentation slip: api_key was meant under plan=free.
    let rules = RuleSet::from_yaml(
        "domain: gateway
descriptors:
  - key: plan
    value: free
    descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 10}
",
    )
    .expect("valid YAML loads");
    let warnings = rules.warnings();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains(":3:") && warnings[0].contains("empty descriptors:"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].contains("neither a limit nor children"),
        "{warnings:?}"
    );
    // Written as meant: none.
    let meant = RuleSet::from_yaml(
        "domain: gateway
descriptors:
  - key: plan
    value: free
    descriptors:
      - key: api_key
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: vip
    rate_limit: {unlimited: true}
",
    )
    .expect("loads");
    assert!(meant.warnings().is_empty(), "{:?}", meant.warnings());
}
