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
pub(crate) struct Strings {
    all: hashbrown::HashSet<Arc<str>>,
    /// The last domain and the last first key: most lines repeat both.
    last: [Option<Arc<str>>; 2],
}

impl Strings {
    /// The shared copy of `text`.
    pub(crate) fn get(&mut self, text: &str) -> Arc<str> {
        if let Some(shared) = self.all.get(text) {
            return shared.clone();
        }
        let shared: Arc<str> = text.into();
        self.all.insert(shared.clone());
        shared
    }

    /// The shared copy of `text`, which is most often what it was the last
    /// time for this `role` (0: a domain, 1: a first key).
    fn get_repeated(&mut self, role: usize, text: &str) -> Arc<str> {
        if let Some(last) = &self.last[role]
            && **last == *text
        {
            return last.clone();
        }
        let shared = self.get(text);
        self.last[role] = Some(shared.clone());
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
    /// Inline for one descriptor (most lines): no allocation of its own.
    #[serde(default, borrow)]
    descriptors: smallvec::SmallVec<[LineDescriptor<'a>; 1]>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: u32,
}

/// A line's `timestamp`: Unix seconds as a number, or text. (Read by a
/// visitor of its own: serde's untagged enums buffer every value first.)
enum Timestamp<'a> {
    Seconds(f64),
    Text(std::borrow::Cow<'a, str>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Timestamp<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visitor<'a> {
            type Value = Timestamp<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("Unix seconds as a number, or an RFC 3339 time")
            }
            fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
                Ok(Timestamp::Seconds(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Timestamp::Seconds(v as f64))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Timestamp::Seconds(v as f64))
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Timestamp::Text(v.into()))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Timestamp::Text(v.to_owned().into()))
            }
        }
        deserializer.deserialize_any(Visitor(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
struct LineDescriptor<'a> {
    #[serde(default, borrow)]
    entries: smallvec::SmallVec<[LineEntry<'a>; 2]>,
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
    parse_bytes_sharing(line.as_bytes(), &mut Strings::default())
}

/// One JSON line (its bytes) as an event, its strings shared through
/// `strings`.
fn parse_bytes_sharing(line: &[u8], strings: &mut Strings) -> Result<Event, String> {
    let parsed: Line = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    let at = match parsed.timestamp {
        Timestamp::Seconds(s) => seconds_to_nanos(s)?,
        Timestamp::Text(t) => parse_time(&t)?,
    };
    Ok(Event {
        at,
        domain: strings.get_repeated(0, &parsed.domain),
        descriptors: parsed
            .descriptors
            .into_iter()
            .map(|d| {
                d.entries
                    .into_iter()
                    .enumerate()
                    .map(|(i, e)| {
                        let key = match i {
                            0 => strings.get_repeated(1, &e.key),
                            _ => strings.get(&e.key),
                        };
                        (key, strings.get(&e.value))
                    })
                    .collect()
            })
            .collect(),
        hits: parsed.hits_addend,
    })
}

/// Every event of a JSON lines file; an error names the file and line.
pub(crate) fn read_jsonl(path: &Path) -> Result<Vec<Event>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // Room for the events at once (a line is rarely under 100 bytes), not
    // doubled and copied as they come; unused room is never touched.
    let size = file.metadata().map_or(0, |m| m.len());
    let mut events = Vec::with_capacity(usize::try_from(size / 100).unwrap_or(0).min(1 << 24));
    let mut strings = Strings::default();
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    // One buffer for every line, not an allocation each; its strings are
    // checked as UTF-8 by the parser, not the whole line first.
    let mut line = Vec::new();
    for i in 1.. {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("{}:{i}: {e}", path.display()))?;
        if read == 0 {
            break;
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        events.push(
            parse_bytes_sharing(&line, &mut strings)
                .map_err(|e| format!("{}:{i}: {e}", path.display()))?,
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
