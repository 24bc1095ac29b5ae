//! Rules: YAML in the envoyproxy/ratelimit format, validated once and compiled
//! into a [`RuleSet`] that matches request descriptors the way the reference
//! does. Nothing here knows about gRPC or the store.

mod changes;
mod compile;
mod error;
mod file;
mod glob;
pub(crate) mod held;
mod lanes;
mod limit;
mod load;
mod matcher;
mod over_limit;

pub use changes::{Restart, restarted_counters};

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::algorithm::Algorithm;
use crate::calendar::{Calendar, Zone};
use crate::clock::NANOS_PER_SEC;

pub use crate::period::{MAX_PERIOD_SECONDS, Unit};
pub use error::{RuleError, RuleErrors};
pub use load::{
    DEFAULT_MAX_HELD_IDS, DEFAULT_MAX_RULE_DEPTH, DEFAULT_MAX_RULE_NODES, DEFAULT_MAX_SLIDING_LOG,
    LoadOptions, load_paths, load_sources, rule_files,
};
pub(crate) use matcher::ShapeEntry;
pub use matcher::{Matched, WalkedEntries};
pub use over_limit::OverLimit;

/// What to answer for a limit when its store cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Fail open: admit the request.
    Allow = 0,
    /// Fail closed: refuse the request.
    Deny,
    /// Fall back to an in-process limit of `requests_per_unit / instances`.
    Local,
}

impl FailureMode {
    /// The name as written in rule files.
    pub fn name(self) -> &'static str {
        match self {
            FailureMode::Allow => "allow",
            FailureMode::Deny => "deny",
            FailureMode::Local => "local",
        }
    }

    /// Parses `allow`, `deny` or `local`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "allow" => Some(FailureMode::Allow),
            "deny" => Some(FailureMode::Deny),
            "local" => Some(FailureMode::Local),
            _ => None,
        }
    }
}

/// A counted limit: `requests_per_unit` per `unit_multiplier` `unit`s,
/// decided by `algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Hits allowed per period.
    pub requests_per_unit: u32,
    /// The window (or refill period) unit.
    pub unit: Unit,
    /// Units per period (`unit_multiplier`, at least 1).
    pub unit_multiplier: u32,
    /// Windows on this zone's calendar (`calendar: true`), else multiples of
    /// the period since the epoch.
    pub calendar: Option<&'static Zone>,
    /// The algorithm that decides it.
    pub algorithm: Algorithm,
    /// Token bucket capacity (defaults to `requests_per_unit`).
    pub burst: u32,
    /// What to do when the store fails; `None` uses the server default.
    pub failure_mode: Option<FailureMode>,
    /// A usage budget: admitted while anything is left, charged in full.
    pub budget: bool,
    /// `consistency: leased`: hits each instance reserves from a shared
    /// store at a time and spends locally; 0 for exact (every hit asks the
    /// store).
    pub lease: u32,
    /// Whether calls hold IDs on it: an in-flight cap (`in_flight`), or a
    /// budget with `reserve: true`.
    pub held: Option<HeldKind>,
}

/// A limit on which calls hold request IDs (see [`crate::algorithm::Held`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldKind {
    /// `in_flight`: at most `requests_per_unit` requests in progress, each
    /// slot held at most `unit_multiplier` seconds.
    InFlight,
    /// `reserve: true` on a budget: a request reserves its hits, its
    /// stream end settles them.
    Reserve,
}

impl Limit {
    /// `requests_per_unit` per one `unit`, the reference's kind of limit.
    pub fn per_unit(requests_per_unit: u32, unit: Unit, algorithm: Algorithm) -> Self {
        Self {
            requests_per_unit,
            unit,
            unit_multiplier: 1,
            calendar: None,
            algorithm,
            burst: requests_per_unit,
            failure_mode: None,
            budget: false,
            lease: 0,
            held: None,
        }
    }

    /// The algorithm's view of this limit.
    pub fn quota(&self) -> crate::algorithm::Quota {
        crate::algorithm::Quota {
            limit: self.requests_per_unit,
            period: self.period_seconds() * NANOS_PER_SEC,
            burst: self.burst.max(1),
            calendar: self.calendar.and_then(|zone| {
                Some(Calendar {
                    unit: self.unit.calendar_unit()?,
                    every: self.unit_multiplier.max(1),
                    zone,
                })
            }),
            budget: self.budget,
        }
    }

    /// This limit as a priority lane of `share` percent sees it (see
    /// `lanes`): admitted only while the node's one counter is below the
    /// share: of the count for the windows and budgets, of the capacity for
    /// a token bucket (whose refill rate stays). A share that leaves no
    /// room refuses every request of the lane.
    pub fn in_lane(self, share: u8) -> Self {
        if share >= 100 {
            return self;
        }
        let part = |n: u32| u32::try_from(u64::from(n) * u64::from(share) / 100).unwrap_or(n);
        match self.algorithm {
            Algorithm::TokenBucket if part(self.burst) == 0 => Self {
                requests_per_unit: 0,
                ..self
            },
            Algorithm::TokenBucket => Self {
                burst: part(self.burst),
                ..self
            },
            _ => Self {
                requests_per_unit: part(self.requests_per_unit),
                ..self
            },
        }
    }

    /// The period in seconds (nominal for calendar limits: 30-day months).
    pub fn period_seconds(&self) -> u64 {
        self.unit.seconds() * u64::from(self.unit_multiplier.max(1))
    }

    /// The limit in a few words, as reports show it: `100/minute
    /// sliding_window`, `5 in flight, each held 600 s at most`.
    pub fn summary(&self) -> String {
        if self.held == Some(HeldKind::InFlight) {
            return format!(
                "{} in flight, each held {} s at most",
                self.requests_per_unit, self.unit_multiplier
            );
        }
        let reserve = if self.held == Some(HeldKind::Reserve) {
            ", reserved"
        } else {
            ""
        };
        format!(
            "{}/{} {}{reserve}",
            self.requests_per_unit,
            self.period_name(),
            self.algorithm
        )
    }

    /// The period as people read it (see [`Unit::period_name`]).
    pub fn period_name(&self) -> String {
        self.unit
            .period_name(self.unit_multiplier, self.calendar.map(|z| z.name()))
    }
}

/// One compiled rule: a descriptor path in a domain with its limit.
#[derive(Debug)]
pub struct Rule {
    /// The reference's composite key, e.g. `domain.key1_value1.subkey1`.
    pub path: String,
    /// `rate_limit.name`, if set (used by `replaces`).
    pub name: Option<String>,
    /// The name as reported in `current_limit.name` (empty when unnamed);
    /// shared so answering a request does not copy it.
    pub reported_name: Arc<str>,
    /// The policy name in response headers: the name, else the path.
    pub policy_name: Arc<str>,
    /// The limit, or `None` for `unlimited: true` (never counted).
    pub limit: Option<Limit>,
    /// Over-limit decisions are reported as OK.
    pub shadow_mode: bool,
    /// What a request over the limit gets: refused, or (`over_limit: tag`)
    /// admitted and tagged for the upstream.
    pub over_limit: OverLimit,
    /// The reference's quota mode: this descriptor refuses a request only
    /// together with every other quota-mode descriptor of it.
    pub quota_mode: bool,
    /// Names of the limits this one replaces when both match a request.
    pub replaces: Vec<String>,
    /// The reference's `detailed_metric`: metrics carry descriptor values.
    pub detailed_metric: bool,
    /// The reference's `value_to_metric`.
    pub value_to_metric: bool,
    /// Where the rule was written.
    pub source: Source,
    /// Its domain.
    pub domain: Box<str>,
    /// Each level of its path (`key_value`, or `key` for any value): what
    /// its metrics are labelled with, never request values.
    pub levels: Box<[Box<str>]>,
    /// For one of several limits (`rate_limits`), the `limit` label that
    /// tells its metrics apart: its name, else its period.
    pub limit_label: Option<Box<str>>,
    /// Its position in [`RuleSet::rules`]: what a decision's
    /// [`AppliedLimit::rule`](crate::limiter::AppliedLimit::rule) names.
    pub index: usize,
}

/// A place in a rule file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The file.
    pub file: Arc<PathBuf>,
    /// 1-based line of the descriptor.
    pub line: u32,
}

/// A validated, compiled set of rules for every domain. Cloning shares the
/// rules themselves (and their metric handles).
#[derive(Debug, Default, Clone)]
pub struct RuleSet {
    domains: hashbrown::HashMap<Box<str>, matcher::Level>,
    rules: Vec<Arc<Rule>>,
    /// What loaded but probably is not what was meant, `file:line: why`.
    warnings: Vec<String>,
}

impl RuleSet {
    /// What loaded but probably is not what was meant (an empty
    /// `descriptors:`, a descriptor with neither a limit nor children),
    /// each `file:line:col: why`.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Whether `domain` has rules.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Every rule, in file order.
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }

    /// The number of domains.
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`), and the
/// characters that do not show as themselves (direction overrides,
/// zero-width and other invisible ones) as `\u{202e}`: a value from a rule
/// file, a control plane or a request cannot start a line of its own in
/// one-rule-per-line output (`tollgate check`, `/rlconfig`, logs), nor
/// display as another value.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let hidden = crate::wire_text::hidden;
    if !text.chars().any(hidden) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else if hidden(c) {
            // Direction overrides, zero-width and other invisible
            // characters: a value could otherwise display as another.
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", printable(&self.path))?;
        match &self.limit {
            None => f.write_str("unlimited")?,
            Some(l) if l.held == Some(HeldKind::InFlight) => f.write_str(&l.summary())?,
            Some(l) => {
                write!(
                    f,
                    "{} per {} ({}",
                    l.requests_per_unit,
                    l.period_name(),
                    l.algorithm
                )?;
                if l.held == Some(HeldKind::Reserve) {
                    f.write_str(", reserved")?;
                }
                if l.algorithm == Algorithm::TokenBucket {
                    write!(f, ", burst {}", l.burst)?;
                }
                if l.budget {
                    f.write_str(", budget")?;
                }
                if l.lease > 0 {
                    write!(f, ", leased {}", l.lease)?;
                }
                if let Some(mode) = l.failure_mode {
                    write!(f, ", failure_mode {}", mode.name())?;
                }
                f.write_str(")")?;
            }
        }
        if let Some(name) = &self.name {
            write!(f, ", name {}", printable(name))?;
        }
        if !self.replaces.is_empty() {
            write!(f, ", replaces {}", printable(&self.replaces.join(",")))?;
        }
        if self.shadow_mode {
            f.write_str(", shadow mode")?;
        }
        if self.over_limit == OverLimit::Tag {
            f.write_str(", over_limit tag")?;
        }
        if self.quota_mode {
            f.write_str(", quota mode")?;
        }
        let file = self.source.file.display().to_string();
        write!(f, "  [{}:{}]", printable(&file), self.source.line)
    }
}

impl fmt::Display for RuleSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for rule in &self.rules {
            writeln!(f, "{rule}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod bound_tests;
#[cfg(test)]
mod shape_tests;
#[cfg(test)]
mod tests;

#[cfg(test)]
mod printable_tests {
    #[test]
    fn controls_and_invisible_characters_are_escaped() {
        assert_eq!(super::printable("admin"), "admin");
        assert_eq!(super::printable("a\nb\u{1b}"), "a\\nb\\u{1b}");
        // "nimda" written backwards with a direction override shows as
        // "admin"; a zero-width space hides in a value.
        assert_eq!(super::printable("\u{202e}nimda"), "\\u{202e}nimda");
        assert_eq!(super::printable("ad\u{200b}min"), "ad\\u{200b}min");
        assert_eq!(super::printable("zoë"), "zoë");
    }
}
