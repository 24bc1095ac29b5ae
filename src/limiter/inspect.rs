//! An operator's look at a client's counters, and their reset: the same
//! planning as a decision (so what is shown is what the next request
//! meets), without spending, counting, logging or showing the observers.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Decision, LimitError, Limiter, Plan, Request};
use crate::store::{CounterKey, Store, StoreError};

/// A reset of a whole rule's or domain's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BulkReset {
    /// On the memory store: every counter of it starts afresh (the memory
    /// store keeps no key names to count).
    Restarted,
    /// On Redis: this many counters were deleted.
    Deleted(usize),
}

/// Why a bulk reset did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BulkResetError {
    /// No rule of that name or path in the domain.
    #[error("no rule '{0}' in domain '{1}' (name a rule as /rlconfig or /limited does)")]
    NoRule(String, String),
    /// More counters than the caller's bound: none deleted.
    #[error(
        "more than {0} counters match; nothing was reset (send a larger \"max_keys\" to reset them all)"
    )]
    TooMany(usize),
    /// The store failed.
    #[error("{0}")]
    Store(StoreError),
}

/// Generations of rules and domains reset on the memory store: their
/// counter keys carry one more entry, so counting starts afresh and the old
/// counters expire unread.
#[derive(Debug, Default)]
pub(super) struct Generations {
    /// Whether any rule or domain was ever reset: the hot path reads only
    /// this until one is.
    any: std::sync::atomic::AtomicBool,
    by_name: arc_swap::ArcSwap<HashMap<String, u64>>,
    next: AtomicU64,
}

impl Generations {
    /// Adds `domain`'s and `rule`'s generations to `key`, when reset.
    pub(super) fn salt(&self, domain: &str, rule: Option<&str>, key: &mut CounterKey) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let by_name = self.by_name.load();
        if by_name.is_empty() {
            return;
        }
        let domain = by_name.get(&format!("d:{domain}"));
        let rule = rule.and_then(|r| by_name.get(&format!("r:{r}")));
        if domain.is_some() || rule.is_some() {
            let salt = format!("{}:{}", domain.unwrap_or(&0), rule.unwrap_or(&0));
            key.entry("\u{0}reset", &salt);
        }
    }

    fn bump(&self, name: String) {
        let generation = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.by_name.rcu(|old| {
            let mut new = HashMap::clone(old);
            new.insert(name.clone(), generation);
            Arc::new(new)
        });
        self.any.store(true, Ordering::Release);
    }
}

impl Limiter {
    /// Every limit `request`'s descriptors meet and what is left of each,
    /// spending nothing (every check asks for 0 hits, and no lease).
    pub async fn peek(&self, request: &Request<'_>) -> Result<Decision, LimitError> {
        let mut plan = Plan::default();
        self.plan(request, &mut plan)?;
        plan.quiet = true;
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

    /// Deletes the counters `request`'s descriptors meet (in the store, and
    /// in the `local` failure mode's fallback): the next request starts
    /// each afresh. Returns the counters that existed.
    pub async fn reset(&self, request: &Request<'_>) -> Result<usize, LimitError> {
        let mut plan = Plan::default();
        self.plan(request, &mut plan)?;
        self.fallback.remove(plan.checks.iter().map(|c| &c.key));
        self.store
            .reset(&plan.checks, self.clock.now())
            .await
            .map_err(LimitError::Unavailable)
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
    ) -> Result<BulkReset, BulkResetError> {
        let rules = self.rules();
        let path = match rule {
            None => None,
            Some(asked) => Some(
                rules
                    .rules()
                    .iter()
                    .find(|r| {
                        r.path
                            .strip_prefix(domain)
                            .is_some_and(|rest| rest.starts_with('.'))
                            && (r.path == asked || *r.policy_name == *asked)
                    })
                    .map(|r| r.path.clone())
                    .ok_or_else(|| BulkResetError::NoRule(asked.to_owned(), domain.to_owned()))?,
            ),
        };
        match &self.store {
            Store::Memory(_) => {
                self.generations.bump(match &path {
                    Some(path) => format!("r:{path}"),
                    None => format!("d:{domain}"),
                });
                Ok(BulkReset::Restarted)
            }
            Store::Redis(store) => {
                let wanted = |entries: &[(String, String)]| match &path {
                    None => true,
                    Some(path) => {
                        let entries: Vec<(&str, &str)> = entries
                            .iter()
                            .map(|(k, v)| (k.as_str(), v.as_str()))
                            .collect();
                        rules
                            .lookup(domain, &entries)
                            .is_some_and(|m| m.rules.iter().any(|r| r.path == *path))
                    }
                };
                let names = store
                    .counters_of(domain, &wanted, max_keys)
                    .await
                    .map_err(BulkResetError::Store)?;
                if names.len() > max_keys {
                    return Err(BulkResetError::TooMany(max_keys));
                }
                store
                    .delete_counters(&names)
                    .await
                    .map(BulkReset::Deleted)
                    .map_err(BulkResetError::Store)
            }
        }
    }
}
