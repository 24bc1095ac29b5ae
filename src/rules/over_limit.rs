//! `over_limit:` on a descriptor: what happens to a request over the
//! descriptor's limits. Absent, it is refused (OVER_LIMIT); `tag` makes
//! them soft limits: the request is admitted and the upstream is told,
//! in a request header, which soft limits it is over.

use super::file::{RawDescriptor, RawRateLimit, at};
use serde_saphyr::Spanned;

/// What a request over a rule's limit gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverLimit {
    /// Refused: OVER_LIMIT (the reference's behaviour, and the default).
    #[default]
    Refuse,
    /// Admitted (OK) and tagged: the rule's name is added to the request
    /// header `x-tollgate-over-limit` on its way upstream.
    Tag,
}

/// The descriptor's `over_limit`, checked against its limits; `Err` says
/// where (line and column) and what is wrong.
pub(super) fn of(
    raw: &RawDescriptor,
    path: &str,
    limits: &[Spanned<RawRateLimit>],
    descriptor_pos: Option<(u32, u32)>,
) -> Result<OverLimit, (Option<(u32, u32)>, String)> {
    let Some(written) = &raw.over_limit else {
        return Ok(OverLimit::Refuse);
    };
    let pos = at(&written.referenced).or(descriptor_pos);
    let value = written.value.0.as_str();
    if value != "tag" {
        return Err((
            pos,
            format!(
                "'{path}' has over_limit: {value:?}; the one value is `tag` (admit and tag \
                 the request); leave it out to refuse"
            ),
        ));
    }
    if limits.is_empty() {
        return Err((
            pos,
            format!("'{path}' has over_limit: tag but no rate_limit to be over (give it one)"),
        ));
    }
    if limits.iter().any(|l| l.value.unlimited == Some(true)) {
        return Err((
            pos,
            format!(
                "'{path}' has over_limit: tag on an unlimited rate_limit, which is never over \
                 (give it a limit, or drop over_limit)"
            ),
        ));
    }
    if raw.shadow_mode == Some(true) {
        return Err((
            pos,
            format!(
                "'{path}' has both shadow_mode: true and over_limit: tag; shadow mode changes \
                 no answer, a soft limit tags the request: choose one"
            ),
        ));
    }
    Ok(OverLimit::Tag)
}

#[cfg(test)]
mod tests {
    use crate::rules::{OverLimit, RuleSet};

    fn error(yaml: &str) -> String {
        RuleSet::from_yaml(yaml).expect_err("refused").to_string()
    }

    #[test]
    fn tag_makes_each_limit_of_the_descriptor_soft() {
        let rules = RuleSet::from_yaml(
            "domain: api
descriptors:
  - key: user
    over_limit: tag
    rate_limit: {name: soft, unit: minute, requests_per_unit: 5}
  - key: org
    over_limit: tag
    rate_limits:
      - {name: a, unit: minute, requests_per_unit: 5}
      - {name: b, unit: hour, requests_per_unit: 50}
  - key: team
    rate_limit: {unit: minute, requests_per_unit: 5}
",
        )
        .expect("loads");
        let modes: Vec<_> = rules.rules().iter().map(|r| r.over_limit).collect();
        assert_eq!(
            modes,
            [
                OverLimit::Tag,
                OverLimit::Tag,
                OverLimit::Tag,
                OverLimit::Refuse
            ]
        );
        assert!(rules.to_string().contains("over_limit tag"), "{rules}");
    }

    #[test]
    fn another_value_is_an_error_at_its_line() {
        let e = error(
            "domain: api
descriptors:
  - key: user
    over_limit: refuse
    rate_limit: {unit: minute, requests_per_unit: 5}
",
        );
        assert!(e.starts_with("rules.yaml:4:"), "{e}");
        assert!(
            e.contains(r#"over_limit: "refuse""#) && e.contains("`tag`"),
            "{e}"
        );
        // Not a string either.
        let e = error(
            "domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
    over_limit: true
",
        );
        assert!(e.starts_with("rules.yaml:5:"), "{e}");
    }

    #[test]
    fn tag_needs_a_limit_that_can_be_over() {
        let e = error(
            "domain: api
descriptors:
  - key: user
    over_limit: tag
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 5}
",
        );
        assert!(e.starts_with("rules.yaml:4:"), "{e}");
        assert!(e.contains("no rate_limit"), "{e}");
        let e = error(
            "domain: api
descriptors:
  - key: user
    over_limit: tag
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: org
    over_limit: tag
    rate_limit: {unlimited: true}
",
        );
        assert!(e.starts_with("rules.yaml:7:"), "{e}");
        assert!(e.contains("'api.org'") && e.contains("unlimited"), "{e}");
        assert!(!e.contains("api.user"), "{e}");
    }

    #[test]
    fn tag_and_shadow_mode_together_are_an_error() {
        let e = error(
            "domain: api
descriptors:
  - key: user
    shadow_mode: true
    over_limit: tag
    rate_limit: {unit: minute, requests_per_unit: 5}
",
        );
        assert!(e.starts_with("rules.yaml:5:"), "{e}");
        assert!(e.contains("shadow_mode"), "{e}");
    }
}
