//! What a new rule set does to counters already spent: a counter's key names
//! the descriptor, the algorithm, the period and the calendar's zone, so a
//! rule whose algorithm, period or zone changes starts from zero. A reload
//! that does so is legitimate but should never be a surprise.

use std::collections::HashMap;

use super::{Limit, RuleSet};

/// One line per rule of `new` that `old` had with a different counter key:
/// what changed, and that its counters start afresh.
pub fn restarted_counters(old: &RuleSet, new: &RuleSet) -> Vec<String> {
    let before: HashMap<(&str, Option<&str>), &Limit> = old
        .rules()
        .iter()
        .filter_map(|r| Some(((r.path.as_str(), r.name.as_deref()), r.limit.as_ref()?)))
        .collect();
    new.rules()
        .iter()
        .filter_map(|rule| {
            let now = rule.limit.as_ref()?;
            let was = before.get(&(rule.path.as_str(), rule.name.as_deref()))?;
            // What counters are keyed by (a zone by its key: a link and its
            // zone count alike), and what people read.
            let counted = |l: &Limit| {
                (
                    l.algorithm.name(),
                    l.unit
                        .period_name(l.unit_multiplier, l.calendar.map(|z| z.key())),
                )
            };
            let shown = |l: &Limit| {
                (
                    l.algorithm.name(),
                    l.unit
                        .period_name(l.unit_multiplier, l.calendar.map(|z| z.name())),
                )
            };
            let (from, to) = (shown(was), shown(now));
            (counted(was) != counted(now)).then(|| {
                format!(
                    "{}: {} per {} became {} per {}; its counters start from zero",
                    rule.path, from.0, from.1, to.0, to.1
                )
            })
        })
        .collect()
}
