//! What a new rule set does to counters already spent: a counter's key names
//! the descriptor, the algorithm, the period and the calendar's zone, so a
//! rule whose algorithm, period or zone changes starts from zero. A reload
//! that does so is legitimate but should never be a surprise.

use std::collections::HashMap;

use super::{HeldKind, Limit, Rule, RuleSet};

/// A rule whose counters a new rule set restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restart {
    /// The rule's path (`domain.key_value...`).
    pub rule: String,
    /// What changed, and that its counters start afresh, in one line.
    pub line: String,
}

impl std::fmt::Display for Restart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line)
    }
}

/// Every rule of `new` that `old` had with a different counter key.
pub fn restarted_counters(old: &RuleSet, new: &RuleSet) -> Vec<Restart> {
    // An in-flight cap's slots are kept whatever changes (its key names
    // neither a period nor an algorithm); it shares its node's path.
    fn counted_limit(r: &Rule) -> Option<&Limit> {
        r.limit
            .as_ref()
            .filter(|l| l.held != Some(HeldKind::InFlight))
    }
    let before: HashMap<(&str, Option<&str>), &Limit> = old
        .rules()
        .iter()
        .filter_map(|r| Some(((r.path.as_str(), r.name.as_deref()), counted_limit(r)?)))
        .collect();
    new.rules()
        .iter()
        .filter_map(|rule| {
            let now = counted_limit(rule)?;
            let was = before.get(&(rule.path.as_str(), rule.name.as_deref()))?;
            // What a counter's key names (a zone compares by its key: a link
            // and its zone count alike).
            let counted = |l: &Limit| (l.algorithm, l.unit, l.unit_multiplier, l.calendar);
            let shown = |l: &Limit| {
                (
                    l.algorithm.name(),
                    l.unit
                        .period_name(l.unit_multiplier, l.calendar.map(|z| z.name())),
                )
            };
            (counted(was) != counted(now)).then(|| {
                let (from, to) = (shown(was), shown(now));
                Restart {
                    rule: rule.path.clone(),
                    line: format!(
                        "{}: {} per {} became {} per {}; its counters start from zero",
                        rule.path, from.0, from.1, to.0, to.1
                    ),
                }
            })
        })
        .collect()
}
