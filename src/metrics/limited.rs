//! Who is being limited, in Prometheus (`tollgate_limited_*`): per rule, the
//! refusals of its heaviest clients by rank, never by client. A series per
//! client (the reference's `detailed_metric`) grows with the clients an
//! attacker invents; a rank has a fixed number of series per rule, and the
//! admin port's `/limited` names who holds each rank. The numbers come from
//! [`crate::limited`] as a [`LimitedMetrics`].

use super::exposition::{Exposition, Kind};
use super::labels;

/// The view's numbers, read at one moment.
#[derive(Debug, Default)]
pub(crate) struct LimitedMetrics {
    /// Ranks shown per rule (`--limited-metric-ranks`).
    pub ranks: usize,
    /// The rules that refused in the window.
    pub rules: Vec<LimitedRule>,
    /// Refusals by rules past `--limited-rules`.
    pub untracked: u64,
}

/// One rule.
#[derive(Debug)]
pub(crate) struct LimitedRule {
    pub rule: String,
    /// Its refusals in the window.
    pub refused: u64,
    /// Its heaviest clients' refusals in the window, heaviest first.
    pub ranks: Vec<u64>,
}

/// Writes the families.
pub(crate) fn render(out: &mut Exposition<'_>, m: &LimitedMetrics) {
    let name = "tollgate_limited_rule_refusals";
    out.family(
        name,
        "Refusals in the --limited-window, per rule that refused in it.",
        Kind::Gauge,
    );
    for rule in &m.rules {
        out.sample(name, &labels([("rule", rule.rule.as_str())]), rule.refused);
    }
    if m.ranks > 0 {
        let name = "tollgate_limited_top_refusals";
        out.family(
            name,
            "Refusals in the --limited-window of a rule's heaviest clients, by rank (1: the heaviest); /limited names them.",
            Kind::Gauge,
        );
        for rule in &m.rules {
            for (i, n) in rule.ranks.iter().enumerate().take(m.ranks) {
                let rank = (i + 1).to_string();
                out.sample(
                    name,
                    &labels([("rule", rule.rule.as_str()), ("rank", rank.as_str())]),
                    *n,
                );
            }
        }
    }
    out.counter(
        "tollgate_limited_untracked_total",
        "Refusals by rules past --limited-rules (counted, not in the view).",
        m.untracked,
    );
}
