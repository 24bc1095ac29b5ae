//! Traffic for the simulator: timestamped rate limit requests, read from JSON
//! lines and written as them (the generator is `generate.rs`).
//!
//! A JSON line is a RateLimitRequest in the protobuf JSON mapping, exactly
//! what `POST /json` takes (`domain`, `descriptors` of `entries` with `key`
//! and `value`, optional `hitsAddend`), plus `timestamp`: RFC 3339, or Unix
//! seconds as a number.

use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::clock::{NANOS_PER_SEC, Nanos};

/// A descriptor's `(key, value)` entries.
/// Inline (no allocation of its own) for up to two entries.
pub(crate) type Entries = smallvec::SmallVec<[(Arc<str>, Arc<str>); 2]>;

/// A request's descriptors; inline for one, so an event is one block of
/// memory and a replay walks the events in order.
pub(crate) type Descriptors = smallvec::SmallVec<[Entries; 1]>;

/// One shared copy of each string: traffic repeats its domains, keys and
/// values, and a replay that reads them from a few places runs faster than
/// one chasing a fresh allocation per request.
#[derive(Debug, Default)]
pub(crate) struct Strings(std::collections::HashMap<Box<str>, Arc<str>>);

impl Strings {
    /// The shared copy of `text`.
    pub(crate) fn get(&mut self, text: &str) -> Arc<str> {
        if let Some(shared) = self.0.get(text) {
            return shared.clone();
        }
        let shared: Arc<str> = text.into();
        self.0.insert(text.into(), shared.clone());
        shared
    }
}

/// One request at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// When, in nanoseconds since the Unix epoch.
    pub at: Nanos,
    /// The rule domain.
    pub domain: Arc<str>,
    /// Descriptors, each a list of `(key, value)` entries.
    pub descriptors: Descriptors,
    /// Hits (0 means 1, as in the protocol).
    pub hits: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Line<'a> {
    #[serde(borrow)]
    timestamp: Timestamp<'a>,
    #[serde(borrow)]
    domain: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    descriptors: Vec<LineDescriptor<'a>>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Timestamp<'a> {
    Seconds(f64),
    Text(#[serde(borrow)] std::borrow::Cow<'a, str>),
}

#[derive(Deserialize)]
struct LineDescriptor<'a> {
    #[serde(default, borrow)]
    entries: Vec<LineEntry<'a>>,
}

#[derive(Deserialize)]
struct LineEntry<'a> {
    #[serde(borrow)]
    key: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    value: std::borrow::Cow<'a, str>,
}

/// An RFC 3339 time (or Unix seconds as text) in nanoseconds.
pub(crate) fn parse_time(text: &str) -> Result<Nanos, String> {
    if let Ok(seconds) = text.parse::<f64>() {
        return seconds_to_nanos(seconds);
    }
    let ts: jiff::Timestamp = text
        .parse()
        .map_err(|e| format!("'{text}' is not an RFC 3339 time: {e}"))?;
    u64::try_from(ts.as_nanosecond()).map_err(|_| format!("'{text}' is before 1970"))
}

fn seconds_to_nanos(seconds: f64) -> Result<Nanos, String> {
    if !(0.0..4e9).contains(&seconds) {
        return Err(format!("timestamp {seconds} is not a Unix time in seconds"));
    }
    // Whole seconds and the fraction apart: their product would round.
    let whole = seconds.trunc() as u64;
    let fraction = ((seconds - seconds.trunc()) * NANOS_PER_SEC as f64).round() as u64;
    Ok(whole * NANOS_PER_SEC + fraction)
}

/// One JSON line as an event.
#[cfg(test)]
pub(crate) fn parse_line(line: &str) -> Result<Event, String> {
    parse_line_sharing(line, &mut Strings::default())
}

/// One JSON line as an event, its strings shared through `strings`.
pub(crate) fn parse_line_sharing(line: &str, strings: &mut Strings) -> Result<Event, String> {
    let parsed: Line = serde_json::from_str(line).map_err(|e| e.to_string())?;
    let at = match parsed.timestamp {
        Timestamp::Seconds(s) => seconds_to_nanos(s)?,
        Timestamp::Text(t) => parse_time(&t)?,
    };
    Ok(Event {
        at,
        domain: strings.get(&parsed.domain),
        descriptors: parsed
            .descriptors
            .into_iter()
            .map(|d| {
                d.entries
                    .into_iter()
                    .map(|e| (strings.get(&e.key), strings.get(&e.value)))
                    .collect()
            })
            .collect(),
        hits: parsed.hits_addend,
    })
}

/// Every event of a JSON lines file; an error names the file and line.
pub(crate) fn read_jsonl(path: &Path) -> Result<Vec<Event>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut events = Vec::new();
    let mut strings = Strings::default();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        events.push(
            parse_line_sharing(&line, &mut strings)
                .map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?,
        );
    }
    Ok(events)
}

/// Events as JSON lines, as [`read_jsonl`] reads them.
pub(crate) fn to_jsonl<E: std::borrow::Borrow<Event>>(
    events: impl IntoIterator<Item = E>,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    for e in events {
        let e = e.borrow();
        let descriptors: Vec<serde_json::Value> = e
            .descriptors
            .iter()
            .map(|d| {
                serde_json::json!({"entries": d.iter().map(|(k, v)| serde_json::json!({"key": &**k, "value": &**v})).collect::<Vec<_>>()})
            })
            .collect();
        let mut line = serde_json::json!({
            "timestamp": e.at as f64 / NANOS_PER_SEC as f64,
            "domain": &*e.domain,
            "descriptors": descriptors,
        });
        if e.hits > 0 {
            line["hitsAddend"] = e.hits.into();
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_as_post_json_takes_them() {
        let e = parse_line(
            r#"{"timestamp":"2026-01-01T00:00:01.5Z","domain":"api","descriptors":[{"entries":[{"key":"user","value":"ann"},{"key":"path","value":"/x"}]}],"hitsAddend":3}"#,
        )
        .expect("parses");
        assert_eq!(e.at, 1_767_225_601_500_000_000);
        assert_eq!(&*e.domain, "api");
        assert_eq!(e.descriptors[0][1], ("path".into(), "/x".into()));
        assert_eq!(e.hits, 3);
        let e = parse_line(r#"{"timestamp":1767225600.25,"domain":"api","descriptors":[]}"#)
            .expect("parses");
        assert_eq!(e.at, 1_767_225_600_250_000_000);
        assert!(
            parse_line(r#"{"domain":"api"}"#).is_err(),
            "a timestamp is required"
        );
        assert!(parse_line(r#"{"timestamp":-5,"domain":"api"}"#).is_err());
        assert!(parse_line(r#"{"timestamp":"yesterday","domain":"api"}"#).is_err());
    }
}
