//! An operator's look at a client's counters, and their reset: the same
//! planning as a decision (so what is shown is what the next request
//! meets), without spending, counting, logging or showing the observers.

use super::{Decision, LimitError, Limiter, Plan, Request};
use crate::rules::RuleSet;
use crate::store::redis::Wanted;
use crate::store::{ResetError, ResetScope, ScopeTag, StoreError};

/// Why a bulk reset did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BulkResetError {
    /// No rule of that name or path in the domain.
    #[error(
        "no rule '{0}' in domain '{1}' (name a rule by its path, as /rlconfig and /limited show it)"
    )]
    NoRule(String, String),
    /// No rule names the domain.
    #[error("no rule in domain '{0}': nothing to reset (the domains with rules are in /rlconfig)")]
    NoDomain(String),
    /// The name is shared by several rules of the domain.
    #[error("{count} rules of domain '{1}' are named '{0}': name one by its path ({paths})", count = .2.len(), paths = .2.join(", "))]
    Ambiguous(String, String, Vec<String>),
    /// More counters than the caller's bound: none deleted.
    #[error("{0}")]
    TooMany(ResetError),
    /// The store failed.
    #[error("{0}")]
    Store(ResetError),
}

impl From<ResetError> for BulkResetError {
    fn from(e: ResetError) -> Self {
        match e {
            ResetError::TooMany(_) => Self::TooMany(e),
            ResetError::Store(_) => Self::Store(e),
        }
    }
}

/// What a reset of one client's counters did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reset {
    /// The limits the descriptors meet (0: no rule limits them, and
    /// nothing was reset).
    pub limits: usize,
    /// The counters that existed and were deleted.
    pub deleted: usize,
}

impl Limiter {
    /// Every limit `request`'s descriptors meet and what is left of each,
    /// spending nothing (every check asks for 0 hits, and no lease).
    pub async fn peek(&self, request: &Request<'_>) -> Result<Decision, LimitError> {
        // An operator's look: nothing counted or logged.
        let mut plan = Plan {
            quiet: true,
            ..Plan::default()
        };
        self.plan(request, &mut plan)?;
        for check in &mut plan.checks {
            check.hits = 0;
            check.lease = 0;
        }
        if !plan.checks.is_empty() {
            self.store
                .decide(&mut plan.checks, self.clock.now())
                .await
                .map_err(LimitError::Unavailable)?;
        }
        self.finish(request, &mut plan, None)
    }

    /// Deletes the counters `request`'s descriptors meet (in the store,
    /// and in the `local` failure mode's fallback): the next request starts
    /// each afresh.
    pub async fn reset(&self, request: &Request<'_>) -> Result<Reset, LimitError> {
        let mut plan = Plan {
            quiet: true,
            ..Plan::default()
        };
        self.plan(request, &mut plan)?;
        let limits = plan.checks.len();
        if limits == 0 {
            return Ok(Reset { limits, deleted: 0 });
        }
        let now = self.clock.now();
        self.fallback.remove(plan.checks.iter().map(|c| &c.key));
        let deleted = self
            .store
            .reset(ResetScope::Keys(&plan.checks), now)
            .await
            .map_err(|e| match e {
                ResetError::Store(e) => LimitError::Unavailable(e),
                e @ ResetError::TooMany(_) => {
                    LimitError::Unavailable(StoreError::Script(e.to_string()))
                }
            })?;
        Ok(Reset { limits, deleted })
    }
}

impl Limiter {
    /// Resets every counter of `rule` (its path or name) in `domain`, or of
    /// the whole domain: on Redis at most `max_keys` of them (more: nothing
    /// is reset, and the error says so).
    pub async fn reset_all(
        &self,
        domain: &str,
        rule: Option<&str>,
        max_keys: usize,
    ) -> Result<usize, BulkResetError> {
        let rules = self.rules();
        if !rules.has_domain(domain) {
            return Err(BulkResetError::NoDomain(domain.to_owned()));
        }
        let path = match rule {
            None => None,
            Some(asked) => Some(rule_path(&rules, domain, asked)?),
        };
        let wanted = |entries: &[(String, String)]| {
            let entries: Vec<(&str, &str)> = entries
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let names = |m: crate::rules::Matched<'_>| {
                m.rules
                    .iter()
                    .any(|r| Some(r.path.as_str()) == path.as_deref())
            };
            // A node's held IDs (an in-flight cap's list) are its rule's
            // too: the rules a request ID's entry reaches there.
            let mut held = entries.clone();
            held.push(("request_id", "-"));
            rules.lookup(domain, &entries).is_some_and(names)
                || rules.lookup(domain, &held).is_some_and(names)
        };
        let tag = ScopeTag::of(domain, path.as_deref());
        // The `local` failure mode's counters go too.
        self.fallback.remove_scope(tag);
        let scope = ResetScope::Bulk {
            domain,
            tag,
            wanted: path.is_some().then_some(&wanted as Wanted<'_>),
            max_keys,
        };
        Ok(self.store.reset(scope, self.clock.now()).await?)
    }
}

/// The path of the rule of `domain` that `asked` names: its path, or a name
/// no other rule of the domain has.
fn rule_path(rules: &RuleSet, domain: &str, asked: &str) -> Result<String, BulkResetError> {
    let in_domain = rules.rules().iter().filter(|r| *r.domain == *domain);
    let mut named = Vec::new();
    for rule in in_domain {
        if rule.path == asked {
            return Ok(rule.path.clone());
        }
        if *rule.policy_name == *asked && !named.contains(&rule.path) {
            named.push(rule.path.clone());
        }
    }
    match named.len() {
        0 => Err(BulkResetError::NoRule(asked.to_owned(), domain.to_owned())),
        1 => Ok(named.remove(0)),
        _ => Err(BulkResetError::Ambiguous(
            asked.to_owned(),
            domain.to_owned(),
            named,
        )),
    }
}
