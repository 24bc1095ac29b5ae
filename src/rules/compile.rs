//! Validation and compilation of parsed files into a [`RuleSet`]. Every check
//! happens here, once: a compiled rule only holds valid values.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_saphyr::{Location, Spanned};

use super::file::{RawDescriptor, RawFile, RawRateLimit, parse};
use super::glob::Glob;
use super::matcher::{KeyRules, Level, Node};
use super::{FailureMode, Limit, LoadOptions, Rule, RuleError, RuleErrors, RuleSet, Source, Unit};
use crate::algorithm::Algorithm;

/// `domain="d",key1="a_b",key2="c"`: the reference's Prometheus labels.
pub(crate) fn metric_labels<'a>(domain: &str, keys: impl Iterator<Item = &'a str>) -> String {
    let mut labels = String::from("domain=\"");
    crate::metrics::label_value(&mut labels, domain);
    labels.push('"');
    for (i, key) in keys.enumerate() {
        labels.push_str(&format!(",key{}=\"", i + 1));
        crate::metrics::label_value(&mut labels, key);
        labels.push('"');
    }
    labels
}

pub(super) struct Compiler {
    options: LoadOptions,
    /// Domain -> (file that first declared it, its rules).
    domains: hashbrown::HashMap<Box<str>, (Arc<PathBuf>, Level)>,
    rules: Vec<Arc<Rule>>,
    errors: Vec<RuleError>,
}

fn at(loc: &Location) -> Option<(u32, u32)> {
    (loc.line() > 0).then(|| (loc.line() as u32, loc.column() as u32))
}

impl Compiler {
    pub(super) fn new(options: LoadOptions) -> Self {
        Self {
            options,
            domains: hashbrown::HashMap::new(),
            rules: Vec::new(),
            errors: Vec::new(),
        }
    }

    pub(super) fn add_file(&mut self, file: &Path, text: &str) {
        let raw: RawFile = match parse(text) {
            Ok(raw) => raw,
            Err((pos, message)) => {
                self.errors.push(RuleError::new(
                    file,
                    pos,
                    format!("invalid rule file: {message}"),
                ));
                return;
            }
        };
        let domain = match &raw.domain {
            Some(d) if !d.value.0.is_empty() => d.value.0.clone(),
            other => {
                let pos = other.as_ref().and_then(|d| at(&d.referenced));
                self.errors.push(RuleError::new(
                    file,
                    pos.or(Some((1, 1))),
                    "config file cannot have empty domain (set `domain:`)",
                ));
                return;
            }
        };
        let file = Arc::new(file.to_path_buf());
        let mut level = match self.domains.remove(domain.as_str()) {
            None => Level::default(),
            Some((_, level)) if self.options.merge_domains => level,
            Some((first, level)) => {
                self.errors.push(RuleError::new(
                    &file,
                    raw.domain.as_ref().and_then(|d| at(&d.referenced)),
                    format!(
                        "duplicate domain '{domain}' in config file (already declared in {}); \
                         enable --merge-domains to merge files of one domain",
                        first.display()
                    ),
                ));
                self.domains.insert(domain.into(), (first, level));
                return;
            }
        };
        let domain: Arc<str> = domain.into();
        self.add_descriptors(
            &file,
            &domain,
            (&domain, &[]),
            &mut level,
            raw.descriptors.unwrap_or_default(),
        );
        self.domains
            .entry(Box::from(&*domain))
            .or_insert_with(|| (file.clone(), Level::default()))
            .1 = level;
    }

    fn add_descriptors(
        &mut self,
        file: &Arc<PathBuf>,
        domain: &Arc<str>,
        (parent, parent_levels): (&str, &[String]),
        level: &mut Level,
        list: Vec<Spanned<RawDescriptor>>,
    ) {
        for spanned in list {
            let pos = at(&spanned.referenced);
            let raw = spanned.value;
            let err = |msg: String| RuleError::new(file, pos, msg);
            let key = match raw.key.as_ref().map(|k| k.0.as_str()) {
                Some(k) if !k.is_empty() => k.to_owned(),
                _ => {
                    self.errors
                        .push(err("descriptor has empty key (set `key:`)".into()));
                    continue;
                }
            };
            let value = raw.value.as_ref().map(|v| v.0.clone());
            let composite = match &value {
                Some(v) => format!("{key}_{v}"),
                None => key.clone(),
            };
            let path = format!("{parent}.{composite}");
            // The path's levels as a list: a value may itself contain dots.
            let mut levels = parent_levels.to_vec();
            levels.push(composite);
            let glob = value.as_deref().and_then(Glob::new);

            let share = raw.share_threshold.unwrap_or(false);
            if share && glob.is_none() {
                self.errors.push(err(format!(
                    "share_threshold on '{path}' needs a wildcard value (with `*`)"
                )));
            }
            let mut raw = raw;
            let rate_limit = raw.rate_limit.take();
            let children = raw.descriptors.take().unwrap_or_default();
            let rule = rate_limit.and_then(|rl| {
                let rule = self.compile_rule(file, domain, (&path, &levels), &raw, rl, pos)?;
                let rule = Arc::new(rule);
                self.rules.push(rule.clone());
                Some(rule)
            });
            let mut node = Node {
                rule,
                children: Level::default(),
                shared_pattern: share.then(|| value.clone().unwrap_or_default().into()),
            };
            self.add_descriptors(file, domain, (&path, &levels), &mut node.children, children);

            let rules: &mut KeyRules = level.keys.entry(Box::from(key.as_str())).or_default();
            let duplicate = match (&value, glob) {
                (None, _) => rules.default.replace(node).is_some(),
                (Some(v), None) => rules.exact.insert(v.as_str().into(), node).is_some(),
                (Some(_), Some(glob)) => {
                    let duplicate = rules.wildcards.iter().any(|(g, _)| *g == glob);
                    if !duplicate {
                        rules.wildcards.push((glob, node));
                    }
                    duplicate
                }
            };
            if duplicate {
                self.errors
                    .push(err(format!("duplicate descriptor composite key '{path}'")));
            }
        }
    }

    fn compile_rule(
        &mut self,
        file: &Arc<PathBuf>,
        domain: &Arc<str>,
        (path, levels): (&str, &[String]),
        raw: &RawDescriptor,
        rl: Spanned<RawRateLimit>,
        descriptor_pos: Option<(u32, u32)>,
    ) -> Option<Rule> {
        let pos = at(&rl.referenced).or(descriptor_pos);
        let rl = rl.value;
        let before = self.errors.len();
        let mut err = |pos: Option<(u32, u32)>, msg: String| {
            self.errors.push(RuleError::new(file, pos, msg));
        };
        let name = rl.name.map(|n| n.0).filter(|n| !n.is_empty());
        let mut replaces = Vec::new();
        for r in rl.replaces.unwrap_or_default() {
            match r.value.name.map(|n| n.0).filter(|n| !n.is_empty()) {
                None => err(
                    at(&r.referenced).or(pos),
                    format!("'{path}' should not have an empty replaces entry (set `name:`)"),
                ),
                Some(n) if Some(&n) == name.as_ref() => err(
                    at(&r.referenced).or(pos),
                    format!(
                        "replaces should not contain name of same descriptor ('{n}' in '{path}')"
                    ),
                ),
                Some(n) => replaces.push(n),
            }
        }

        let limit = if rl.unlimited.unwrap_or(false) {
            for (field, p) in [
                ("unit", rl.unit.as_ref().map(|s| &s.referenced)),
                (
                    "requests_per_unit",
                    rl.requests_per_unit.as_ref().map(|s| &s.referenced),
                ),
                ("algorithm", rl.algorithm.as_ref().map(|s| &s.referenced)),
                ("burst", rl.burst.as_ref().map(|s| &s.referenced)),
            ] {
                if let Some(p) = p {
                    err(
                        at(p).or(pos),
                        format!(
                            "'{path}' should not specify rate limit {field} when unlimited is true"
                        ),
                    );
                }
            }
            None
        } else {
            let unit = match &rl.unit {
                None => {
                    err(
                        pos,
                        format!(
                            "'{path}' rate_limit has no unit (one of second, minute, hour, day, week, month, year)"
                        ),
                    );
                    None
                }
                Some(u) => {
                    let unit = Unit::from_name(&u.value.0);
                    if unit.is_none() {
                        err(
                            at(&u.referenced).or(pos),
                            format!(
                                "invalid rate limit unit '{}' in '{path}' (expected second, minute, hour, day, week, month or year)",
                                u.value.0
                            ),
                        );
                    }
                    unit
                }
            };
            let requests_per_unit = rl.requests_per_unit.as_ref().map(|r| r.value.0);
            if requests_per_unit.is_none() {
                err(pos, format!("'{path}' rate_limit has no requests_per_unit"));
            }
            let algorithm = match &rl.algorithm {
                None => Some(self.options.default_algorithm),
                Some(a) => {
                    let alg = Algorithm::from_name(&a.value.0);
                    if alg.is_none() {
                        err(
                            at(&a.referenced).or(pos),
                            format!(
                                "unknown algorithm '{}' in '{path}' (expected fixed_window, sliding_window or token_bucket)",
                                a.value.0
                            ),
                        );
                    }
                    alg
                }
            };
            let burst = match &rl.burst {
                None => requests_per_unit,
                Some(b) if algorithm != Some(Algorithm::TokenBucket) => {
                    err(
                        at(&b.referenced).or(pos),
                        format!(
                            "'{path}' sets burst, which only token_bucket uses (set `algorithm: token_bucket`)"
                        ),
                    );
                    None
                }
                Some(b) if b.value.0 == 0 => {
                    err(
                        at(&b.referenced).or(pos),
                        format!("'{path}' burst must be at least 1"),
                    );
                    None
                }
                Some(b) => Some(b.value.0),
            };
            let failure_mode = match &rl.failure_mode {
                None => Some(None),
                Some(m) => {
                    let mode = FailureMode::from_name(&m.value.0);
                    if mode.is_none() {
                        err(
                            at(&m.referenced).or(pos),
                            format!(
                                "unknown failure_mode '{}' in '{path}' (expected allow, deny or local)",
                                m.value.0
                            ),
                        );
                    }
                    mode.map(Some)
                }
            };
            match (unit, requests_per_unit, algorithm, burst, failure_mode) {
                (Some(unit), Some(rpu), Some(algorithm), Some(burst), Some(failure_mode)) => {
                    let limit = Limit {
                        requests_per_unit: rpu,
                        unit,
                        algorithm,
                        burst: burst.max(1),
                        failure_mode,
                    };
                    // A bucket that takes centuries to refill would overflow the
                    // stores' arithmetic; no one means it.
                    if algorithm == Algorithm::TokenBucket
                        && crate::algorithm::bucket_span(&limit.quota()).is_none()
                    {
                        err(
                            rl.burst.as_ref().and_then(|b| at(&b.referenced)).or(pos),
                            format!(
                                "'{path}' burst {} at {rpu} per {} takes more than 100 years to refill; lower the burst or raise requests_per_unit",
                                limit.burst,
                                unit.name()
                            ),
                        );
                        None
                    } else {
                        Some(limit)
                    }
                }
                _ => None,
            }
        };
        if self.errors.len() > before {
            return None;
        }
        Some(Rule {
            path: path.to_owned(),
            reported_name: name.as_deref().unwrap_or("").into(),
            policy_name: name.as_deref().unwrap_or(path).into(),
            name,
            limit,
            shadow_mode: raw.shadow_mode.unwrap_or(false),
            replaces,
            detailed_metric: raw.detailed_metric.unwrap_or(false),
            value_to_metric: raw.value_to_metric.unwrap_or(false),
            source: Source {
                file: file.clone(),
                line: descriptor_pos.map_or(0, |p| p.0),
            },
            metric_labels: metric_labels(domain, levels.iter().map(String::as_str)),
            stats: std::sync::OnceLock::new(),
        })
    }

    pub(super) fn finish(self) -> Result<RuleSet, RuleErrors> {
        if !self.errors.is_empty() {
            return Err(RuleErrors(self.errors));
        }
        Ok(RuleSet {
            domains: self
                .domains
                .into_iter()
                .map(|(domain, (_, level))| (domain, level))
                .collect(),
            rules: self.rules,
        })
    }
}
