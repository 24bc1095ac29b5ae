//! Reading rule files from disk: one file, or every `.yaml`/`.yml` file under a
//! directory. Hidden entries are skipped, so a Kubernetes ConfigMap mount
//! (with its `..data` and `..2024_…` directories) is read once, through the
//! visible symlinks.

use std::path::{Path, PathBuf};

use super::compile::Compiler;
use super::{RuleError, RuleErrors, RuleSet};
use crate::algorithm::Algorithm;
use crate::calendar::Zone;

/// How a rule set is built.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Merge files that declare the same domain (the reference's
    /// `MERGE_DOMAIN_CONFIG`) instead of refusing them.
    pub merge_domains: bool,
    /// The algorithm for limits that do not name one.
    pub default_algorithm: Algorithm,
    /// The time zone of calendar limits that do not name one (`--time-zone`).
    pub time_zone: &'static Zone,
    /// Every limit under this algorithm instead of its own (calendar quotas
    /// excepted): what `tollgate simulate --algorithm` compares.
    pub algorithm_override: Option<Algorithm>,
    /// The most YAML nodes (mappings, lists, scalars) one rule file may hold
    /// (`--max-rule-nodes`): a bound on the parser's work and memory. About
    /// 11 per descriptor with a limit.
    pub max_rule_nodes: usize,
    /// The deepest descriptor nesting a rule file may have
    /// (`--max-rule-depth`): a bound on the parser's and compiler's stack.
    pub max_rule_depth: usize,
    /// The largest `requests_per_unit` of a `sliding_log` limit
    /// (`--max-sliding-log`): the log holds an entry per admitted request.
    pub max_sliding_log: u32,
    /// The most request IDs one key holds (`--max-held-ids`): the largest
    /// `in_flight` limit, and a reserved budget's open reservations.
    pub max_held_ids: u32,
}

/// `--max-held-ids`'s default: a key's held IDs are read whole by each call
/// on it (about 60 bytes each with a UUID; in Redis about 1 ms per 1,000,
/// so a client holding many cannot make Redis slow for everyone).
pub const DEFAULT_MAX_HELD_IDS: u32 = 1_000;

/// `--max-sliding-log`'s default: a sliding log keeps one entry per
/// admitted request (16 bytes in memory, about 10 in Redis) and each
/// decision reads the key's whole log.
pub const DEFAULT_MAX_SLIDING_LOG: u32 = 1_000;

/// `--max-rule-depth`'s default: descriptors nested 16 deep. Parsing and
/// compiling recurse per level: at this depth a rule file loads even on a
/// 2 MiB stack (tokio's default for blocking threads) in a debug build (a
/// test holds it; 20 levels did not), and the server loads rules on 8 MiB
/// stacks.
pub const DEFAULT_MAX_RULE_DEPTH: usize = 16;

/// `--max-rule-nodes`'s default: about 180,000 descriptors with a limit in
/// one file.
pub const DEFAULT_MAX_RULE_NODES: usize = 2_000_000;

impl Default for LoadOptions {
    #[expect(
        clippy::expect_used,
        reason = "UTC is in the time zone database bundled into the binary (jiff's tzdb-bundle-always)"
    )]
    fn default() -> Self {
        Self {
            merge_domains: false,
            default_algorithm: Algorithm::SlidingWindow,
            time_zone: Zone::get("UTC").expect("UTC is in the bundled time zone database"),
            algorithm_override: None,
            max_rule_nodes: DEFAULT_MAX_RULE_NODES,
            max_rule_depth: DEFAULT_MAX_RULE_DEPTH,
            max_sliding_log: DEFAULT_MAX_SLIDING_LOG,
            max_held_ids: DEFAULT_MAX_HELD_IDS,
        }
    }
}

/// The rule files under `paths`, and the paths that could not be read.
pub fn rule_files(paths: &[PathBuf]) -> (Vec<PathBuf>, Vec<RuleError>) {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        collect(path, &mut files, &mut errors);
    }
    (files, errors)
}

/// Loads every rule file under `paths` (files or directories) as one set.
pub fn load_paths(paths: &[PathBuf], options: &LoadOptions) -> Result<RuleSet, RuleErrors> {
    let (files, mut errors) = rule_files(paths);
    let mut sources = Vec::with_capacity(files.len());
    for file in files {
        match std::fs::read_to_string(&file) {
            Ok(text) => sources.push((file, text)),
            Err(e) => errors.push(RuleError::new(&file, None, format!("cannot read: {e}"))),
        }
    }
    if !errors.is_empty() {
        return Err(RuleErrors(errors));
    }
    load_sources(&sources, options)
}

impl RuleSet {
    /// The rules of one YAML document with the default load options, as if
    /// read from a file named `rules.yaml` (the name errors give).
    pub fn from_yaml(text: &str) -> Result<Self, RuleErrors> {
        load_sources(
            &[(PathBuf::from("rules.yaml"), text.to_owned())],
            &LoadOptions::default(),
        )
    }
}

/// Builds a rule set from `(file name, text)` pairs, in order.
pub fn load_sources(
    sources: &[(PathBuf, String)],
    options: &LoadOptions,
) -> Result<RuleSet, RuleErrors> {
    let mut compiler = Compiler::new(*options);
    for (file, text) in sources {
        compiler.add_file(file, text);
    }
    compiler.finish()
}

fn collect(path: &Path, files: &mut Vec<PathBuf>, errors: &mut Vec<RuleError>) {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) => {
            errors.push(RuleError::new(path, None, format!("cannot read: {e}")));
            return;
        }
    };
    if meta.is_file() {
        files.push(path.to_path_buf());
        return;
    }
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) => {
            errors.push(RuleError::new(path, None, format!("cannot list: {e}")));
            return;
        }
    };
    let mut children: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.'))
        })
        .collect();
    // Sorted, so the same directory always loads in the same order.
    children.sort();
    for child in children {
        if child.is_dir() {
            collect(&child, files, errors);
        } else if matches!(
            child.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            files.push(child);
        }
    }
}
