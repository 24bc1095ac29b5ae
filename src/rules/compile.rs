//! Validation and compilation of parsed files into a [`RuleSet`]. Every check
//! happens here, once: a compiled rule only holds valid values.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_saphyr::Spanned;

use super::file::{RawDescriptor, RawFile, RawInFlight, RawLanes, RawRateLimit, at, parse};
use super::glob::Glob;
use super::matcher::{KeyRules, Level, Node};
use super::{LoadOptions, Rule, RuleError, RuleErrors, RuleSet, Source};

/// Why two limits of one descriptor cannot both exist, if they cannot: the
/// same policy name (headers and metrics could not tell them apart) or the
/// same counter.
fn clash(a: &Rule, b: &Rule) -> Option<String> {
    if a.policy_name == b.policy_name {
        return Some(format!(
            "both are called '{}'; give them distinct names",
            b.policy_name
        ));
    }
    let counter = |r: &Rule| {
        r.limit
            .map(|l| (l.algorithm, l.unit, l.unit_multiplier, l.calendar))
    };
    (counter(a).is_some() && counter(a) == counter(b)).then(|| {
        "they would share one counter (same algorithm and period); drop one or change its period"
            .to_owned()
    })
}

pub(super) struct Compiler {
    options: LoadOptions,
    /// Domain -> (file that first declared it, its rules).
    domains: hashbrown::HashMap<Box<str>, (Arc<PathBuf>, Level)>,
    rules: Vec<Arc<Rule>>,
    errors: Vec<RuleError>,
    /// What loads but probably is not what was meant (`tollgate check`
    /// prints them; a reload logs them).
    warnings: Vec<RuleError>,
    /// Descriptor path (`domain.key_value...`) -> where it was first declared,
    /// so that a duplicate can name it.
    declared: hashbrown::HashMap<String, Declared>,
}

/// A descriptor's optional shape as written.
type RawShape<T> = Box<Spanned<T>>;

/// Where a descriptor was declared: its file, and its line and column.
type Declared = (Arc<PathBuf>, Option<(u32, u32)>);

impl Compiler {
    pub(super) fn new(options: LoadOptions) -> Self {
        Self {
            options,
            domains: hashbrown::HashMap::new(),
            rules: Vec::new(),
            errors: Vec::new(),
            warnings: Vec::new(),
            declared: hashbrown::HashMap::new(),
        }
    }

    pub(super) fn add_file(&mut self, file: &Path, text: &str) {
        let bounds = super::file::Bounds {
            nodes: self.options.max_rule_nodes,
            depth: self.options.max_rule_depth,
        };
        let raw: RawFile = match parse(text, bounds) {
            Ok(raw) => raw,
            Err(errors) => {
                for (pos, message) in errors {
                    self.errors.push(RuleError::new(
                        file,
                        pos,
                        format!("invalid rule file: {message}"),
                    ));
                }
                return;
            }
        };
        let domain = match &raw.domain {
            // As a request's domain is read (`wire_text::from_wire`): a
            // domain beginning with the marker is matched in its escaped form.
            Some(d) if !d.value.0.is_empty() => crate::wire_text::of_rule(&d.value.0).into_owned(),
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
                Some(k) if !k.is_empty() => crate::wire_text::of_rule(k).into_owned(),
                _ => {
                    self.errors
                        .push(err("descriptor has empty key (set `key:`)".into()));
                    continue;
                }
            };
            // As a value read off the wire would be (the same text, unless
            // it begins with the marker of bytes that were not UTF-8).
            let value = raw
                .value
                .as_ref()
                .map(|v| crate::wire_text::of_rule(&v.0).into_owned());
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
            let lanes = raw.lanes.take();
            let in_flight = raw.in_flight.take();
            let rate_limit = raw.rate_limit.take();
            let rate_limits = raw.rate_limits.take();
            let children = match raw.descriptors.take() {
                Some(Some(children)) => children,
                Some(None) => {
                    self.warnings.push(err(format!(
                        "'{path}' has an empty descriptors: (nothing under it is its child: \
                         an entry meant as its child is indented as its sibling?)"
                    )));
                    Vec::new()
                }
                None => Vec::new(),
            };
            let limits: Vec<Spanned<RawRateLimit>> = match (rate_limit, rate_limits) {
                (Some(_), Some(list)) => {
                    self.errors.push(RuleError::new(
                        file,
                        at(&list.referenced).or(pos),
                        format!(
                            "'{path}' has both rate_limit and rate_limits; use rate_limit for one limit or rate_limits for several"
                        ),
                    ));
                    Vec::new()
                }
                (Some(one), None) => vec![one],
                (None, Some(list)) if list.value.is_empty() => {
                    self.errors.push(RuleError::new(
                        file,
                        at(&list.referenced).or(pos),
                        format!("'{path}' has an empty rate_limits list (give at least one limit)"),
                    ));
                    Vec::new()
                }
                (None, Some(list)) => list.value,
                (None, None) => Vec::new(),
            };
            let over_limit = match super::over_limit::of(&raw, &path, &limits, pos) {
                Ok(mode) => mode,
                Err((at, message)) => {
                    self.errors.push(RuleError::new(file, at, message));
                    super::OverLimit::Refuse
                }
            };
            if limits.is_empty() && children.is_empty() && in_flight.is_none() {
                self.warnings.push(err(format!(
                    "'{path}' has neither a limit nor children: a request it matches is \
                     answered OK, unlimited (say so with rate_limit: {{unlimited: true}}, \
                     or give it rate_limit or descriptors)"
                )));
            }
            let several = limits.len() > 1;
            let mut rules: smallvec::SmallVec<[Arc<Rule>; 1]> = smallvec::SmallVec::new();
            for rl in limits {
                let limit_pos = at(&rl.referenced).or(pos);
                let Some(rule) =
                    self.compile_rule(file, domain, (&path, &levels), &raw, rl, (pos, several))
                else {
                    continue;
                };
                if let Some(why) = rules.iter().find_map(|r| clash(r, &rule)) {
                    self.errors.push(RuleError::new(
                        file,
                        limit_pos,
                        format!("two limits of '{path}' clash: {why}"),
                    ));
                    continue;
                }
                let rule = Arc::new(Rule {
                    index: self.rules.len(),
                    over_limit,
                    ..rule
                });
                self.rules.push(rule.clone());
                rules.push(rule);
            }
            let mut node = Node {
                rules,
                children: Level::default(),
                shared_pattern: share.then(|| value.clone().unwrap_or_default().into()),
                lanes: None,
                held: smallvec::SmallVec::new(),
            };
            self.add_descriptors(file, domain, (&path, &levels), &mut node.children, children);
            self.shapes(
                (file, domain),
                (&path, &key, &levels),
                (lanes, in_flight),
                &raw,
                (&mut node, pos),
            );

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
            let first = self
                .declared
                .entry(path.clone())
                .or_insert_with(|| (file.clone(), pos));
            if duplicate {
                let (first_file, first_pos) = first;
                let place = match first_pos {
                    Some((line, _)) if first_file == file => format!("line {line}"),
                    Some((line, _)) => format!("{}:{line}", first_file.display()),
                    None => first_file.display().to_string(),
                };
                let message = format!(
                    "duplicate descriptor composite key '{path}': declared first at {place}; \
                     give it one entry (a value's limits and children in one place)"
                );
                self.errors.push(err(message));
            }
        }
    }

    /// A node's lanes and in-flight cap, and its held IDs' rules (see
    /// `held`). Not inlined: rule files nest, and this frame stays off the
    /// recursion's.
    #[inline(never)]
    fn shapes(
        &mut self,
        (file, domain): (&Arc<PathBuf>, &Arc<str>),
        (path, key, levels): (&str, &str, &[String]),
        (lanes, in_flight): (Option<RawShape<RawLanes>>, Option<RawShape<RawInFlight>>),
        raw: &RawDescriptor,
        (node, pos): (&mut Node, Option<(u32, u32)>),
    ) {
        let mut err = |at: Option<(u32, u32)>, msg: String| {
            self.errors.push(RuleError::new(file, at, msg));
        };
        if let Some(lanes) = lanes {
            node.lanes = super::lanes::compile((path, key), *lanes, node, &mut err);
        }
        let cap = in_flight.and_then(|f| {
            let limit = super::held::in_flight(&f, path, pos, &self.options, &mut err)?;
            Some(super::held::in_flight_rule(
                &f,
                limit,
                raw,
                (file, domain),
                (path, levels),
                pos,
            ))
        });
        let reserves = node.rules.iter().any(|r| {
            r.limit
                .is_some_and(|l| l.held == Some(super::HeldKind::Reserve))
        });
        let child_has = |k: &str| node.children.keys.contains_key(k);
        let lane_key = node.lanes.as_ref().map(|l| &*l.key);
        let holds = (
            cap.is_some() || reserves,
            &child_has as &dyn Fn(&str) -> bool,
            lane_key,
        );
        super::held::check_node((path, key), holds, pos, &mut err);
        if let Some(rule) = cap {
            let rule = Arc::new(Rule {
                index: self.rules.len(),
                ..rule
            });
            self.rules.push(rule.clone());
            node.held.push(rule);
        }
        let reserved = node
            .rules
            .iter()
            .filter(|r| r.limit.is_some_and(|l| l.held.is_some()))
            .cloned();
        node.held.extend(reserved.collect::<Vec<_>>());
    }

    fn compile_rule(
        &mut self,
        file: &Arc<PathBuf>,
        domain: &Arc<str>,
        (path, levels): (&str, &[String]),
        raw: &RawDescriptor,
        rl: Spanned<RawRateLimit>,
        (descriptor_pos, several): (Option<(u32, u32)>, bool),
    ) -> Option<Rule> {
        let pos = at(&rl.referenced).or(descriptor_pos);
        let rl = rl.value;
        let before = self.errors.len();
        let mut err = |pos: Option<(u32, u32)>, msg: String| {
            self.errors.push(RuleError::new(file, pos, msg));
        };
        let name = rl
            .name
            .as_ref()
            .map(|n| n.0.clone())
            .filter(|n| !n.is_empty());
        let mut replaces = Vec::new();
        for r in rl.replaces.iter().flatten() {
            match r
                .value
                .name
                .as_ref()
                .map(|n| n.0.clone())
                .filter(|n| !n.is_empty())
            {
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

        if several && rl.unlimited.unwrap_or(false) {
            err(
                pos,
                format!(
                    "'{path}' has `unlimited: true` in rate_limits; an unlimited descriptor has one `rate_limit: {{unlimited: true}}`"
                ),
            );
        }
        let limit = super::limit::compile(&rl, path, pos, &self.options, &mut err);
        if self.errors.len() > before {
            return None;
        }
        // One of several limits: told apart by its name, else its period.
        let policy_name = match (&name, &limit) {
            (Some(name), _) => name.clone(),
            (None, Some(limit)) if several => format!("{path}/{}", limit.period_name()),
            (None, _) => path.to_owned(),
        };
        let limit_label = several.then(|| {
            name.clone()
                .or_else(|| limit.map(|l| l.period_name()))
                .unwrap_or_default()
        });
        Some(Rule {
            path: path.to_owned(),
            reported_name: name.as_deref().unwrap_or("").into(),
            policy_name: policy_name.into(),
            name,
            limit,
            shadow_mode: raw.shadow_mode.unwrap_or(false),
            // Set with the descriptor's (see `add_descriptors`).
            over_limit: super::OverLimit::Refuse,
            quota_mode: raw.quota_mode.unwrap_or(false),
            replaces,
            detailed_metric: raw.detailed_metric.unwrap_or(false),
            value_to_metric: raw.value_to_metric.unwrap_or(false),
            source: Source {
                file: file.clone(),
                // Each of several limits at its own line.
                line: if several { pos } else { descriptor_pos }.map_or(0, |p| p.0),
            },
            domain: (**domain).into(),
            levels: levels.iter().map(|l| l.as_str().into()).collect(),
            limit_label: limit_label.map(Into::into),
            // Set when the rule joins the set (see `add_descriptors`).
            index: 0,
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
            warnings: self.warnings.iter().map(ToString::to_string).collect(),
        })
    }
}
