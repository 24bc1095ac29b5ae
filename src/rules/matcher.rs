//! Descriptor matching, exactly as the reference: at each level take the entry
//! with the same key and value, else the first wildcard value that matches (in
//! file order), else the key-only default; a limit applies only when the
//! matched node is at the request descriptor's last entry; a node without
//! children ends the walk.

use std::sync::Arc;

use smallvec::SmallVec;

use super::glob::Glob;
use super::{Rule, RuleSet};

/// The rules under one descriptor level, by entry key.
#[derive(Debug, Default, Clone)]
pub(crate) struct Level {
    pub(crate) keys: hashbrown::HashMap<Box<str>, KeyRules>,
}

/// Every rule for one entry key at one level.
#[derive(Debug, Default, Clone)]
pub(crate) struct KeyRules {
    pub(crate) exact: hashbrown::HashMap<Box<str>, Node>,
    pub(crate) wildcards: Vec<(Glob, Node)>,
    pub(crate) default: Option<Node>,
}

/// One descriptor of a rule file.
#[derive(Debug, Default, Clone)]
pub(crate) struct Node {
    /// The descriptor's limits: one for `rate_limit`, several for
    /// `rate_limits`, none without either.
    pub(crate) rules: SmallVec<[Arc<Rule>; 1]>,
    pub(crate) children: Level,
    /// `share_threshold` on a wildcard: every matching value shares one
    /// counter, keyed by the pattern.
    pub(crate) shared_pattern: Option<Box<str>>,
}

/// The rules a descriptor matched (one per limit of the descriptor), and the
/// entries whose counter key uses the wildcard pattern instead of the value
/// (`share_threshold`).
#[derive(Debug)]
pub struct Matched<'a> {
    /// The rules, never empty: all of them must admit a request.
    pub rules: &'a [Arc<Rule>],
    /// `(entry index, pattern)` for shared wildcard entries; usually empty.
    pub shared: SmallVec<[(usize, &'a str); 1]>,
}

impl RuleSet {
    /// The rules for one request descriptor (its entries in order), if any.
    pub fn lookup<'a>(&'a self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched<'a>> {
        let mut level = self.domains.get(domain)?;
        let mut shared = SmallVec::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            let rules = level.keys.get(*key)?;
            let node = rules
                .exact
                .get(*value)
                .or_else(|| {
                    rules
                        .wildcards
                        .iter()
                        .find(|(glob, _)| glob.matches(value))
                        .map(|(_, node)| node)
                })
                .or(rules.default.as_ref())?;
            if let Some(pattern) = &node.shared_pattern {
                shared.push((i, &**pattern));
            }
            if i + 1 == entries.len() {
                return (!node.rules.is_empty()).then_some(Matched {
                    rules: &node.rules,
                    shared,
                });
            }
            if node.children.keys.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}
