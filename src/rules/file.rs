//! The rule file as written: the envoyproxy/ratelimit YAML format plus
//! Tollgate's optional fields inside `rate_limit` and the `rate_limits`
//! list. Unknown keys are refused (`deny_unknown_fields`), and every node
//! that a later check may complain about keeps its line and column
//! (`Spanned`).

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::{Location, Spanned};

/// One YAML file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFile {
    pub(crate) domain: Option<Spanned<Text>>,
    pub(crate) descriptors: Option<Vec<Spanned<RawDescriptor>>>,
}

/// One entry of a `descriptors` list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDescriptor {
    pub(crate) key: Option<Text>,
    pub(crate) value: Option<Text>,
    pub(crate) rate_limit: Option<Spanned<RawRateLimit>>,
    // Tollgate's: several limits on one descriptor, all enforced together.
    pub(crate) rate_limits: Option<Spanned<Vec<Spanned<RawRateLimit>>>>,
    /// Absent (`None`), or written: `Some(None)` for a `descriptors:` with
    /// nothing under it (an indentation slip, usually).
    #[serde(default, deserialize_with = "present")]
    pub(crate) descriptors: Option<Option<Vec<Spanned<RawDescriptor>>>>,
    pub(crate) shadow_mode: Option<bool>,
    // Tollgate's: `tag` makes the descriptor's limits soft (see `over_limit`).
    pub(crate) over_limit: Option<Box<Spanned<Text>>>,
    pub(crate) detailed_metric: Option<bool>,
    pub(crate) value_to_metric: Option<bool>,
    pub(crate) share_threshold: Option<bool>,
    pub(crate) quota_mode: Option<bool>,
    // Tollgate's: priority lanes sharing the descriptor's counter.
    pub(crate) lanes: Option<Box<Spanned<RawLanes>>>,
    // Tollgate's: a cap on requests in progress, held by request ID.
    pub(crate) in_flight: Option<Box<Spanned<RawInFlight>>>,
    // Free-form in the reference; accepted and not interpreted.
    #[allow(dead_code)]
    pub(crate) metadata: Option<IgnoredAny>,
}

/// A field that is written, even as nothing (`key:`), as `Some`; an absent
/// one is `None` (by `#[serde(default)]`).
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// A `rate_limit` block.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    pub(crate) requests_per_unit: Option<Spanned<Count>>,
    pub(crate) unit: Option<Spanned<Text>>,
    pub(crate) unlimited: Option<bool>,
    pub(crate) name: Option<Text>,
    pub(crate) replaces: Option<Vec<Spanned<RawReplaces>>>,
    // Tollgate's additions.
    pub(crate) algorithm: Option<Spanned<Text>>,
    pub(crate) burst: Option<Spanned<Count>>,
    pub(crate) failure_mode: Option<Spanned<Text>>,
    pub(crate) unit_multiplier: Option<Spanned<Count>>,
    pub(crate) calendar: Option<Spanned<bool>>,
    pub(crate) time_zone: Option<Spanned<Text>>,
    pub(crate) budget: Option<Spanned<bool>>,
    pub(crate) consistency: Option<Spanned<Text>>,
    pub(crate) lease: Option<Spanned<Count>>,
    pub(crate) reserve: Option<Box<Spanned<bool>>>,
}

/// `in_flight: {limit: N, max_hold_seconds: S}` on a descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawInFlight {
    pub(crate) limit: Option<Spanned<Count>>,
    pub(crate) max_hold_seconds: Option<Spanned<Count>>,
    pub(crate) name: Option<Text>,
}

/// `lanes: {key: K, shares: {LANE: PERCENT, ...}}` on a descriptor.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLanes {
    pub(crate) key: Option<Text>,
    pub(crate) shares: Option<std::collections::BTreeMap<String, Spanned<Count>>>,
}

/// An entry of `replaces`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReplaces {
    pub(crate) name: Option<Text>,
}

/// A scalar read as text: `value: 42` is the string "42", as the reference
/// (Go's YAML into a string field) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Text(pub(crate) String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Text;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Text, E> {
                Ok(Text(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
        }
        d.deserialize_str(V)
    }
}

/// A whole number from 0 to `u32::MAX`, with an error that shows the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count(pub(crate) u32);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a whole number from 0 to 4294967295")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Count, E> {
                u32::try_from(v)
                    .map(Count)
                    .map_err(|_| E::custom(format!("{v} is too large (at most 4294967295)")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Count, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("{v} is negative (expected 0 or more)")))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Count, E> {
                Err(E::custom(format!("{v} is not a whole number")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Count, E> {
                Err(E::custom(format!("'{v}' is not a number")))
            }
        }
        d.deserialize_any(V)
    }
}

/// Parses one file's text. The errors carry the parser's line and column
/// when it knows them: one per top-level descriptor that has one (see
/// [`each_descriptors_error`]), so one schema error does not hide the rest.
pub(crate) fn parse(text: &str, bounds: Bounds) -> Result<RawFile, Vec<ParseError>> {
    parse_once(text, bounds).map_err(|first| {
        let mut errors = each_descriptors_error(text, bounds);
        if !errors.contains(&first) {
            errors.insert(0, first);
        }
        errors.sort_by_key(|(at, _)| *at);
        errors
    })
}

/// A node's line and column, when the parser knows them.
pub(super) fn at(loc: &Location) -> Option<(u32, u32)> {
    (loc.line() > 0).then(|| (loc.line() as u32, loc.column() as u32))
}

/// A parse error: where (line, column) when known, and what.
pub(crate) type ParseError = (Option<(u32, u32)>, String);

/// The file's top-level descriptors as far as a loose parse finds them.
#[derive(Deserialize)]
struct Outline {
    #[allow(dead_code)]
    domain: Option<IgnoredAny>,
    descriptors: Option<Vec<Spanned<IgnoredAny>>>,
}

/// Each top-level descriptor parsed alone, in a copy of the file whose other
/// descriptors' lines are blank (so line numbers hold): its first error, if
/// any. Empty when the descriptors cannot be told apart by line (a flow list
/// on one line, or a file that does not parse even loosely).
fn each_descriptors_error(text: &str, bounds: Bounds) -> Vec<ParseError> {
    let Ok(Some(outline)) = serde_saphyr::from_str::<Option<Outline>>(text) else {
        return Vec::new();
    };
    let starts: Vec<usize> = outline
        .descriptors
        .unwrap_or_default()
        .iter()
        .map(|d| d.referenced.line() as usize)
        .collect();
    if starts.len() < 2 || starts.windows(2).any(|w| w[0] >= w[1]) || starts[0] == 0 {
        return Vec::new();
    }
    let lines: Vec<&str> = text.lines().collect();
    let mut errors = Vec::new();
    for (i, &start) in starts.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(lines.len() + 1);
        let other = |n: usize| {
            starts.iter().enumerate().any(|(j, &s)| {
                let e = starts.get(j + 1).copied().unwrap_or(lines.len() + 1);
                j != i && n >= s && n < e
            })
        };
        let alone: String = lines
            .iter()
            .enumerate()
            .map(|(k, line)| {
                let n = k + 1;
                if other(n) && !(n >= start && n < end) {
                    ""
                } else {
                    line
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        if let Err(error) = parse_once(&alone, bounds) {
            errors.push(error);
        }
    }
    errors
}

/// The parser's bounds on one rule file: its YAML nodes (`--max-rule-nodes`)
/// and its descriptor nesting (`--max-rule-depth`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub(crate) nodes: usize,
    pub(crate) depth: usize,
}

fn parse_once(text: &str, bounds: Bounds) -> Result<RawFile, ParseError> {
    let mut options = serde_saphyr::Options::default();
    // The budget is ours: a file of many per-customer rules is a real use.
    // Events are about two per node. A level of descriptors is two levels of
    // YAML (a list of mappings); the file's mapping and the deepest limit's
    // add two.
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = bounds.nodes;
    budget.max_events = bounds.nodes.saturating_mul(3);
    budget.max_depth = bounds.depth.saturating_mul(2).saturating_add(2);
    options.budget = Some(budget);
    // Our own message names the file, line and column; the parser's snippet
    // would repeat them across several lines.
    options.with_snippet = false;
    // Booleans are true and false: YAML 1.1's yes/no/on/off (and "yes" in
    // quotes) are refused, not taken for a flag.
    options.strict_booleans = true;
    serde_saphyr::from_str_with_options::<Option<RawFile>>(text, options)
        .map(|file| {
            file.unwrap_or(RawFile {
                domain: None,
                descriptors: None,
            })
        })
        .map_err(|e| {
            let at = e.location().as_ref().and_then(at);
            let mut message = e.to_string();
            // The location goes in front, as file:line:column; drop the copy.
            if let Some(i) = message.rfind(" at line ") {
                message.truncate(i);
            }
            (at, explain(text, at, message, bounds))
        })
}

/// The parser's message in the words of a rule file's author: what the YAML
/// library says about its own options becomes what to change in the file.
fn explain(text: &str, at: Option<(u32, u32)>, message: String, bounds: Bounds) -> String {
    if message.contains("budget breached") {
        if message.contains("Depth") {
            return format!(
                "descriptors are nested more than {} deep (--max-rule-depth): raise the bound or \
                 flatten the rules",
                bounds.depth
            );
        }
        if message.contains("Nodes") || message.contains("Events") {
            return format!(
                "the file has more than {} YAML nodes (--max-rule-nodes, about 11 per \
                 descriptor with a limit): raise the bound or split the file",
                bounds.nodes
            );
        }
        return format!("the file is past a bound of the YAML parser: {message}");
    }
    let lines: Vec<&str> = text.lines().collect();
    if let Some(key) = message
        .strip_prefix("duplicate mapping key: ")
        .map(|k| k.split(',').next().unwrap_or(k).trim())
    {
        let first = at.and_then(|(line, column)| first_key_line(&lines, line, column, key));
        return match first {
            Some(first) => format!("`{key}` is given twice in one mapping (first on line {first})"),
            None => format!("`{key}` is given twice in one mapping"),
        };
    }
    if message.contains("expected sequence")
        && let Some(key) = at.and_then(|(line, column)| parent_key(&lines, line, column))
    {
        let hint = if key == "rate_limits" {
            "; for a single limit write `rate_limit:` (a mapping)"
        } else {
            ""
        };
        return format!("`{key}` must be a list (items starting with `- `){hint}");
    }
    message
}

/// The line (1-based) of the first `key:` in the mapping whose repeated key is
/// at `line`:`column`: searched upwards at that column, up to where the
/// mapping starts.
fn first_key_line(lines: &[&str], line: u32, column: u32, key: &str) -> Option<usize> {
    let column = column.checked_sub(1)? as usize;
    for n in (0..(line as usize).saturating_sub(1)).rev() {
        let text = lines.get(n)?;
        let indent = text.len() - text.trim_start().len();
        if text.trim().is_empty() || text.trim_start().starts_with('#') {
            continue;
        }
        let at_column = text.get(column..).unwrap_or("");
        if indent <= column && at_column.starts_with(key) && at_column[key.len()..].starts_with(':')
        {
            return Some(n + 1);
        }
        // A line left of the mapping's column ends the mapping.
        if indent < column {
            return None;
        }
    }
    None
}

/// The key whose value holds the node at `line`:`column`: the nearest line
/// above, or the same line before `column`, that ends in `key:` or holds
/// `key: ` left of the node.
fn parent_key(lines: &[&str], line: u32, column: u32) -> Option<String> {
    let key_of = |text: &str| {
        let t = text.trim_start().trim_start_matches("- ");
        t.split_once(':').map(|(k, _)| k.trim().to_string())
    };
    let index = (line as usize).checked_sub(1)?;
    let here = lines.get(index)?;
    let column = (column as usize).saturating_sub(1);
    let before = here.get(..column).unwrap_or("");
    if before.trim_end().ends_with(':')
        || before.contains(": ") && before.trim_start().ends_with('{')
    {
        return key_of(before);
    }
    for n in (0..index).rev() {
        let text = lines[n];
        if text.trim().is_empty() || text.trim_start().starts_with('#') {
            continue;
        }
        let indent = text.len() - text.trim_start().len();
        if indent < column {
            return key_of(text);
        }
    }
    None
}
