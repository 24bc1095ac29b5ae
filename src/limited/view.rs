//! What `/limited` answers (and `tollgate top` reads): rules, their
//! clients and every descriptor of each client's last refused request;
//! sorted, cut to the slots, searched and paged.

use serde::{Deserialize, Serialize};

use crate::clock::Nanos;

/// One key and value of a descriptor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Entry {
    pub key: String,
    pub value: String,
}

/// One client of a rule, as `/limited` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ClientView {
    /// Every descriptor of its last refused request.
    pub descriptors: Vec<Vec<Entry>>,
    /// Refusals in the window (at most `error` too many).
    pub refused: u64,
    /// Admissions by the rule since it was tracked, in the window.
    pub admitted: u64,
    /// Its share of the rule's refusals in the window.
    pub share: f64,
    /// The most `refused` may overstate.
    pub error: u64,
    pub first_refused: String,
    pub last_refused: String,
    /// Identity across threads and instances (a hash of the counted
    /// descriptor), hex.
    pub id: String,
    #[serde(skip)]
    pub(crate) first_refused_at: Nanos,
    #[serde(skip)]
    pub(crate) last_refused_at: Nanos,
}

/// One rule, as `/limited` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RuleView {
    /// The rule's name, else its path (as response headers name it).
    pub rule: String,
    pub domain: String,
    /// Its path (`domain.key_value...`, as `/rlconfig` shows it), which
    /// names it unambiguously (a reset takes it), when the rule is still in
    /// force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Where it is written (`file:line`), when the rule is still in force.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Every refusal of the rule in the window.
    pub refused: u64,
    /// Heaviest first.
    pub clients: Vec<ClientView>,
}

/// `/limited`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct View {
    /// `instance`: this instance's requests; `merged`: every instance's.
    pub scope: String,
    /// Merged: how many instances' views are in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<usize>,
    pub window_seconds: u64,
    /// Clients held per rule: a client refused more than the rule's
    /// refusals divided by this is always shown.
    pub slots: usize,
    /// Heaviest rule first.
    pub rules: Vec<RuleView>,
    /// Rules in the whole view, when `rules` is one page of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_rules: Option<usize>,
    /// The `offset` of the next page, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<usize>,
}

impl View {
    /// Keeps `limit` rules from the `offset`th (heaviest first), saying how
    /// many there are and where the next page starts.
    pub(crate) fn paginate(&mut self, offset: usize, limit: usize) {
        let total = self.rules.len();
        self.rules.drain(..offset.min(total));
        self.rules.truncate(limit);
        let end = offset.saturating_add(limit);
        self.total_rules = Some(total);
        self.next_offset = (end < total).then_some(end);
    }

    /// Sorts (heaviest first), keeps `slots` clients per rule and those
    /// matching `search`, and works out each client's share.
    pub(crate) fn finish(&mut self, slots: usize, search: Option<&str>) {
        for rule in &mut self.rules {
            rule.clients
                .sort_by(|a, b| b.refused.cmp(&a.refused).then(a.id.cmp(&b.id)));
            rule.clients.truncate(slots);
            for c in &mut rule.clients {
                c.share = match rule.refused {
                    0 => 0.0,
                    n => (c.refused as f64 / n as f64).min(1.0),
                };
            }
            if let Some(search) = search.filter(|s| !s.is_empty()) {
                rule.clients.retain(|c| {
                    c.descriptors
                        .iter()
                        .flatten()
                        .any(|e| e.key.contains(search) || e.value.contains(search))
                });
            }
        }
        if search.is_some_and(|s| !s.is_empty()) {
            self.rules.retain(|r| !r.clients.is_empty());
        }
        self.rules
            .sort_by(|a, b| b.refused.cmp(&a.refused).then(a.rule.cmp(&b.rule)));
    }
}

/// Nanoseconds since the epoch as RFC 3339 (UTC).
pub(super) fn rfc3339(at: Nanos) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(at))
        .map(|t| t.to_string())
        .unwrap_or_default()
}
