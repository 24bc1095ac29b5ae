//! How rule files are read, the same for `serve`, `check` and `simulate`:
//! one flattened group, so the three commands cannot drift apart.

use clap::Args;

use super::values::{AlgorithmArg, parse_zone};
use crate::calendar::Zone;
use crate::rules::LoadOptions;

/// The rule-loading flags.
#[derive(Debug, Args, Clone)]
pub(crate) struct RuleLoadArgs {
    /// Algorithm for limits that do not name one.
    #[arg(long, env = "TOLLGATE_DEFAULT_ALGORITHM", value_enum, default_value_t = AlgorithmArg::SlidingWindow)]
    pub default_algorithm: AlgorithmArg,

    /// Merge rule files that declare the same domain (the reference's
    /// MERGE_DOMAIN_CONFIG=true is also honoured).
    #[arg(long, env = "TOLLGATE_MERGE_DOMAINS")]
    pub merge_domains: bool,

    /// Time zone of calendar limits that do not set `time_zone` (an IANA
    /// name such as Europe/Berlin).
    #[arg(long, env = "TOLLGATE_TIME_ZONE", default_value = "UTC", value_parser = parse_zone)]
    pub time_zone: &'static Zone,

    /// The most YAML nodes (mappings, lists, scalars) in one rule file: about
    /// 11 per descriptor with a limit. A bound on the parser's work and memory.
    #[arg(long, env = "TOLLGATE_MAX_RULE_NODES", default_value_t = crate::rules::DEFAULT_MAX_RULE_NODES, value_parser = clap::value_parser!(usize))]
    pub max_rule_nodes: usize,

    /// The deepest descriptor nesting in one rule file (levels of
    /// `descriptors:`). A bound on the parser's and compiler's stack.
    #[arg(long, env = "TOLLGATE_MAX_RULE_DEPTH", default_value_t = crate::rules::DEFAULT_MAX_RULE_DEPTH, value_parser = clap::value_parser!(usize))]
    pub max_rule_depth: usize,

    /// The largest requests_per_unit of an `algorithm: sliding_log` limit:
    /// the log keeps an entry per admitted request in its period (16 bytes
    /// in memory, about 10 in Redis) and each decision reads it whole.
    #[arg(long, env = "TOLLGATE_MAX_SLIDING_LOG", default_value_t = crate::rules::DEFAULT_MAX_SLIDING_LOG, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_sliding_log: u32,

    /// The most request IDs one key holds: an `in_flight` limit at most,
    /// and a reserved budget's open reservations (past it, a reservation is
    /// refused). Each call on the key reads its held IDs whole (about 60
    /// bytes each with a UUID; about 1 ms of Redis per 1,000).
    #[arg(long, env = "TOLLGATE_MAX_HELD_IDS", default_value_t = crate::rules::DEFAULT_MAX_HELD_IDS, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_held_ids: u32,
}

impl RuleLoadArgs {
    /// How rules are loaded.
    pub(crate) fn load_options(&self) -> LoadOptions {
        LoadOptions {
            merge_domains: self.merge_domains,
            default_algorithm: self.default_algorithm.into(),
            time_zone: self.time_zone,
            algorithm_override: None,
            max_rule_nodes: self.max_rule_nodes,
            max_rule_depth: self.max_rule_depth,
            max_sliding_log: self.max_sliding_log,
            max_held_ids: self.max_held_ids,
        }
    }

    /// The reference's switch for domain merging, `MERGE_DOMAIN_CONFIG=true`.
    pub(super) fn apply_reference_env(&mut self, env: &dyn Fn(&str) -> Option<String>) {
        if env("MERGE_DOMAIN_CONFIG").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            self.merge_domains = true;
        }
    }
}
