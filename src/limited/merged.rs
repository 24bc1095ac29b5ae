//! Every instance's view together (`/limited?scope=merged`): on a shared
//! store (Redis), each instance publishes its view every
//! [`PUBLISH_EVERY`] (its [`PUBLISHED_RULES`] heaviest rules), and the one
//! asked adds its own, fresh, to the others' that are recent.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ClientView, Limited, RuleView, View, rfc3339};
use crate::clock::{NANOS_PER_SEC, Nanos};
use crate::rules::RuleSet;
use crate::store::StoreError;
use crate::store::ViewShare;

/// How often each instance publishes its view.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_secs(5);
/// A published view older than this is left out (its instance is gone).
const STALE_AFTER: Nanos = 3 * 5 * NANOS_PER_SEC;
/// The heaviest rules an instance publishes (bounding what each writes).
pub(crate) const PUBLISHED_RULES: usize = 50;
/// The largest view an instance publishes, and the largest one read: a
/// view that would be larger loses its lightest clients, then its lightest
/// rules, until it fits. Readers skip anything larger without reading it
/// (another process wrote it).
pub(crate) const PUBLISHED_BYTES: usize = 1 << 20;
/// The most instances' views one merged read takes.
const MAX_VIEWS: usize = 256;

#[derive(Debug, Serialize, Deserialize)]
struct Published {
    /// When it was published (ns since the epoch).
    at: Nanos,
    view: View,
}

impl Limited {
    /// Publishes this instance's view to `store`, under its name.
    pub(crate) async fn publish(
        &self,
        share: &ViewShare,
        rules: &RuleSet,
    ) -> Result<(), StoreError> {
        let instance = self.instance();
        let mut view = self.view(None, None, rules);
        // Nobody limited, and the others know it (or never heard of this
        // instance): nothing to write. An idle instance costs Redis nothing.
        let empty = view.rules.is_empty();
        if self
            .published_empty
            .swap(empty, std::sync::atomic::Ordering::Relaxed)
            && empty
        {
            return Ok(());
        }
        view.rules.truncate(PUBLISHED_RULES);
        let mut published = Published {
            at: self.clock.now(),
            view,
        };
        let body = loop {
            let body = serde_json::to_string(&published)
                .map_err(|e| StoreError::Script(format!("view: {e}")))?;
            if body.len() <= PUBLISHED_BYTES || !shrink(&mut published.view) {
                break body;
            }
        };
        share
            .put(
                instance,
                &body,
                (Duration::from_nanos(STALE_AFTER), PUBLISHED_BYTES),
            )
            .await
    }

    /// This instance's view (fresh) and every other instance's recent one,
    /// merged: a client's counts summed over instances.
    pub(crate) async fn merged(
        &self,
        share: &ViewShare,
        (domain, search): (Option<&str>, Option<&str>),
        rules: &RuleSet,
    ) -> Result<View, StoreError> {
        let mut views = vec![self.view(domain, None, rules)];
        let recent = (
            Duration::from_nanos(STALE_AFTER),
            PUBLISHED_BYTES,
            MAX_VIEWS,
        );
        for (name, body) in share.get(recent).await? {
            if name == self.instance() {
                continue;
            }
            let Ok(published) = serde_json::from_str::<Published>(&body) else {
                continue;
            };
            views.push(published.view);
        }
        let mut view = merge(views, domain);
        view.finish(self.options.clients, search);
        Ok(view)
    }
}

/// Makes `view` smaller: half its rules' clients (the lightest), or when
/// each holds one at most, its lightest rule. False when nothing is left.
fn shrink(view: &mut View) -> bool {
    let most = view
        .rules
        .iter()
        .map(|r| r.clients.len())
        .max()
        .unwrap_or(0);
    if most > 1 {
        for rule in &mut view.rules {
            rule.clients.truncate(most / 2);
        }
        return true;
    }
    view.rules.pop().is_some()
}

fn at(text: &str) -> Nanos {
    text.parse::<jiff::Timestamp>()
        .ok()
        .and_then(|t| u64::try_from(t.as_nanosecond()).ok())
        .unwrap_or(0)
}

/// The views of several instances as one (`scope: merged`).
fn merge(views: Vec<View>, domain: Option<&str>) -> View {
    let instances = views.len();
    let window_seconds = views.first().map_or(0, |v| v.window_seconds);
    let slots = views.first().map_or(0, |v| v.slots);
    // A rule is its domain and path (two rules may share a name).
    let mut rules: HashMap<(String, String), (RuleView, HashMap<String, ClientView>)> =
        HashMap::new();
    for view in views {
        for rule in view.rules {
            if domain.is_some_and(|d| d != rule.domain) {
                continue;
            }
            let id = (
                rule.domain.clone(),
                rule.path.clone().unwrap_or_else(|| rule.rule.clone()),
            );
            let (merged, clients) = rules.entry(id).or_insert_with(|| {
                (
                    RuleView {
                        clients: Vec::new(),
                        refused: 0,
                        ..rule.clone()
                    },
                    HashMap::new(),
                )
            });
            // Counts from other processes: summed without wrapping.
            merged.refused = merged.refused.saturating_add(rule.refused);
            if merged.source.is_none() {
                merged.source = rule.source.clone();
            }
            for mut c in rule.clients {
                c.first_refused_at = at(&c.first_refused);
                c.last_refused_at = at(&c.last_refused);
                match clients.get_mut(&c.id) {
                    None => {
                        clients.insert(c.id.clone(), c);
                    }
                    Some(m) => {
                        m.refused = m.refused.saturating_add(c.refused);
                        m.admitted = m.admitted.saturating_add(c.admitted);
                        m.error = m.error.saturating_add(c.error);
                        if c.first_refused_at < m.first_refused_at {
                            m.first_refused_at = c.first_refused_at;
                            m.first_refused = rfc3339(c.first_refused_at);
                        }
                        if c.last_refused_at > m.last_refused_at {
                            m.last_refused_at = c.last_refused_at;
                            m.last_refused = rfc3339(c.last_refused_at);
                            m.descriptors = c.descriptors;
                        }
                    }
                }
            }
        }
    }
    View {
        scope: "merged".into(),
        instances: Some(instances),
        window_seconds,
        slots,
        total_rules: None,
        next_offset: None,
        rules: rules
            .into_values()
            .map(|(mut rule, clients)| {
                rule.clients = clients.into_values().collect();
                rule
            })
            .collect(),
    }
}
