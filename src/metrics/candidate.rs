//! The candidate rules' metrics (`tollgate_candidate_*`): names, help and
//! lines. The numbers come from [`crate::candidate`] as a
//! [`CandidateMetrics`].

use super::exposition::{Exposition, Kind};
use super::labels;

/// What the candidate rules report, read at one moment.
#[derive(Debug, Default)]
pub(crate) struct CandidateMetrics {
    /// Per candidate rule.
    pub rules: Vec<CandidateRule>,
    /// Requests the candidate rules would have answered as the live ones.
    pub same: u64,
    /// ... refused where the live rules admitted.
    pub stricter: u64,
    /// ... admitted where the live rules refused.
    pub looser: u64,
}

/// One candidate rule's counts.
#[derive(Debug)]
pub(crate) struct CandidateRule {
    pub rule: String,
    /// Hits it matched.
    pub requests: u64,
    /// Hits it would have refused.
    pub refused: u64,
}

/// Writes the candidate rules' families.
pub(crate) fn render(out: &mut Exposition<'_>, m: &CandidateMetrics) {
    // (name, help, one rule's value)
    type Family = (&'static str, &'static str, fn(&CandidateRule) -> u64);
    let families: [Family; 2] = [
        (
            "tollgate_candidate_requests_total",
            "Hits the candidate rules matched, per rule.",
            |r| r.requests,
        ),
        (
            "tollgate_candidate_refused_total",
            "Hits the candidate rules would have refused, per rule.",
            |r| r.refused,
        ),
    ];
    for (name, help, value) in families {
        out.family(name, help, Kind::Counter);
        for rule in &m.rules {
            out.sample(name, &labels([("rule", rule.rule.as_str())]), value(rule));
        }
    }
    let name = "tollgate_candidate_decisions_total";
    out.family(
        name,
        "Requests by how the candidate rules would have answered them against the live rules.",
        Kind::Counter,
    );
    for (outcome, n) in [
        ("same", m.same),
        ("stricter", m.stricter),
        ("looser", m.looser),
    ] {
        out.sample(name, &format!("outcome=\"{outcome}\""), n);
    }
}
