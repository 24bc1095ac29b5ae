//! The rules in force with what the limiter keeps per rule: each rule's
//! metric handles, found once. Swapped whole on reload, so a request reads
//! the rules and their handles from one snapshot; the rules themselves know
//! nothing of metrics.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use crate::metrics::{LimitStats, Metrics};
use crate::rules::{FailureMode, Rule, RuleSet};

/// A rule set and, by [`Rule::index`], each rule's counters.
pub(crate) struct Compiled {
    rules: Arc<RuleSet>,
    stats: Box<[OnceLock<Arc<LimitStats>>]>,
    /// Domains with a limit whose failure mode is `deny`, and those with a
    /// limit that takes the process's failure mode (see
    /// [`Compiled::denies_undecided`]).
    deny: HashSet<Box<str>>,
    default_mode: HashSet<Box<str>>,
    /// By [`Rule::index`], each rule's counters' owner tag.
    scopes: Box<[u64]>,
}

impl Compiled {
    /// `rules`, no handle found yet.
    pub(super) fn new(rules: RuleSet) -> Self {
        let stats = (0..rules.rules().len()).map(|_| OnceLock::new()).collect();
        let mut deny = HashSet::new();
        let mut default_mode = HashSet::new();
        for rule in rules.rules() {
            match rule.limit.as_ref().map(|l| l.failure_mode) {
                Some(Some(FailureMode::Deny)) => deny.insert(rule.domain.clone()),
                Some(None) => default_mode.insert(rule.domain.clone()),
                _ => false,
            };
        }
        let scopes = rules
            .rules()
            .iter()
            .map(|r| crate::store::scope_tag(&r.domain, Some(&r.path)))
            .collect();
        Self {
            rules: Arc::new(rules),
            stats,
            deny,
            default_mode,
            scopes,
        }
    }

    /// Whether a request that cannot be decided (it does not decode, or
    /// breaks a bound) must be refused rather than failed: its domain
    /// (`None`: not known, so any domain) has a limit whose failure mode is
    /// `deny`, given or (`default`) the process's.
    pub(super) fn denies_undecided(&self, domain: Option<&str>, default: FailureMode) -> bool {
        let denies = |set: &HashSet<Box<str>>| match domain {
            Some(d) => set.contains(d),
            None => !set.is_empty(),
        };
        denies(&self.deny) || (default == FailureMode::Deny && denies(&self.default_mode))
    }

    /// The owner tag of `rule`'s counters (see [`crate::store::scope_tag`]).
    pub(super) fn scope(&self, rule: &Rule) -> u64 {
        match self.scopes.get(rule.index) {
            Some(&tag) => tag,
            // A rule of another set (not planned from this one).
            None => crate::store::scope_tag(&rule.domain, Some(&rule.path)),
        }
    }

    /// The rules.
    pub(super) fn rules(&self) -> &Arc<RuleSet> {
        &self.rules
    }

    /// `rule`'s counters in `metrics`, labelled from its path (the handles
    /// outlive reloads: the registry keeps them by label set); `None` for a
    /// rule whose metrics carry request values (`detailed_metric`,
    /// `value_to_metric`), which are found per request.
    pub(super) fn stats(&self, rule: &Rule, metrics: &Metrics) -> Option<Arc<LimitStats>> {
        if rule.detailed_metric || rule.value_to_metric {
            return None;
        }
        Some(match self.stats.get(rule.index) {
            Some(slot) => slot.get_or_init(|| metrics.limit(&labels(rule))).clone(),
            // A rule of another set (not planned from this one).
            None => metrics.limit(&labels(rule)),
        })
    }
}

/// A rule's metric labels, from its path and limit name.
pub(super) fn labels(rule: &Rule) -> String {
    crate::metrics::rule_labels(
        &rule.domain,
        rule.levels.iter().map(AsRef::as_ref),
        rule.limit_label.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rules_labels_come_from_its_path_whole_and_its_limit_name() {
        let rules = RuleSet::from_yaml(
            "domain: d
descriptors:
  - key: ip
    value: 10.0.0.1
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: api
    rate_limits:
      - {unit: month, requests_per_unit: 100000, calendar: true, time_zone: Europe/Berlin}
      - {unit: second, requests_per_unit: 10}
",
        )
        .expect("loads");
        let metrics = Metrics::new(100, 128);
        let compiled = Compiled::new(rules.clone());
        for rule in rules.rules() {
            let first = compiled.stats(rule, &metrics).expect("from its path");
            let again = compiled.stats(rule, &metrics).expect("from its path");
            assert!(Arc::ptr_eq(&first, &again), "found once");
        }
        let text = metrics.render();
        for labels in [
            r#"domain="d",key1="ip_10.0.0.1",key2="path""#,
            r#"domain="d",key1="api",limit="month@Europe/Berlin""#,
            r#"domain="d",key1="api",limit="second""#,
        ] {
            assert!(text.contains(labels), "{labels} in\n{text}");
        }
    }
}
