//! What a run of rules against traffic produced, and its report: shared by
//! the simulator (`tollgate simulate`, offline) and the candidate rules
//! (`/candidate`, live), which fill the same [`ScenarioResult`] and render
//! it the same way ([`render`]).

mod render;

pub(crate) use render::{report_html, summary_text, write_all};

/// Requests, admitted and refused in one bin of time.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Bin {
    /// Requests the rule matched.
    pub requests: u64,
    /// Of them, refused by this rule.
    pub refused: u64,
    /// Of them, admitted over this rule's soft limit (`over_limit: tag`).
    pub tagged: u64,
}

/// What one rule did over the replay.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct RuleResult {
    /// The rule as `/rlconfig` names it (domain and descriptor path).
    pub rule: String,
    /// Its `name`, if any.
    pub name: Option<String>,
    /// The limit, as `/rlconfig` shows it (e.g. `10/second sliding_window`).
    pub limit: String,
    /// Requests per second the limit allows one client, for plots.
    pub limit_per_second: f64,
    /// Requests the rule matched.
    pub requests: u64,
    /// Of them, not refused by this rule.
    pub admitted: u64,
    /// Of them, refused by this rule.
    pub refused: u64,
    /// Of the admitted, over this rule's soft limit (`over_limit: tag`):
    /// over the limit, admitted and tagged for the upstream.
    pub tagged: u64,
    /// The most of the limit any client had used, from 0 to 1.
    pub peak_usage: f64,
    /// The clients (descriptor values) refused most, most first.
    pub top_refused: Vec<(String, u64)>,
    /// Per bin of `bin_seconds`, from the replay's start.
    #[serde(skip)]
    pub series: Vec<Bin>,
}

impl RuleResult {
    /// The rule with its name, as summaries show it: `api.user (per-user)`.
    pub(crate) fn label(&self) -> String {
        match &self.name {
            Some(name) => format!("{} ({name})", self.rule),
            None => self.rule.clone(),
        }
    }
}

/// The outcome of replaying the traffic under one rule set and algorithm.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ScenarioResult {
    /// The scenario, e.g. `rules.yaml, sliding_window`.
    pub scenario: String,
    /// Requests replayed.
    pub requests: u64,
    /// Requests refused (by any rule).
    pub refused: u64,
    /// Per rule that matched anything, in `/rlconfig` order.
    pub rules: Vec<RuleResult>,
    /// The series' bin width.
    pub bin_seconds: f64,
    /// The first event's time (Unix seconds).
    pub start: f64,
    /// Requests not replayed because the server would refuse them as
    /// malformed (INVALID_ARGUMENT: past a request bound, say).
    pub not_replayed: u64,
    /// The first reason given for one.
    pub not_replayed_why: Option<String>,
}
