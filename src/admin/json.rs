//! RateLimitRequest and RateLimitResponse in the protobuf JSON mapping
//! (lowerCamelCase names; the original snake_case names are accepted too;
//! enums by name; `Duration` as "1.5s"). Unknown fields are refused, as
//! protobuf JSON parsers do.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{Map, Value, json};

type Object = Map<String, Value>;

/// The value of `camel` or `snake` in `obj`, refusing any other field.
fn fields<'a>(
    obj: &'a Object,
    known: &[(&str, &str)],
    at: &str,
) -> Result<Vec<Option<&'a Value>>, String> {
    if let Some(unknown) = obj.keys().find(|k| {
        !known
            .iter()
            .any(|(c, s)| k.as_str() == *c || k.as_str() == *s)
    }) {
        return Err(format!("{at}: unknown field '{unknown}'"));
    }
    Ok(known
        .iter()
        .map(|(camel, snake)| obj.get(*camel).or_else(|| obj.get(*snake)))
        .collect())
}

fn object<'a>(v: &'a Value, at: &str) -> Result<&'a Object, String> {
    v.as_object()
        .ok_or_else(|| format!("{at}: expected an object"))
}

fn string(v: Option<&Value>, at: &str) -> Result<String, String> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("{at}: expected a string")),
    }
}

/// Integers may be JSON numbers or strings, as in the protobuf mapping.
fn integer(v: Option<&Value>, at: &str) -> Result<Option<u64>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{at}: expected a whole number")),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| format!("{at}: expected a whole number")),
        Some(_) => Err(format!("{at}: expected a whole number")),
    }
}

fn u32_field(v: Option<&Value>, at: &str) -> Result<u32, String> {
    integer(v, at)?
        .unwrap_or(0)
        .try_into()
        .map_err(|_| format!("{at}: too large"))
}

fn unit(v: Option<&Value>, at: &str) -> Result<i32, String> {
    match v {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(name)) => Unit::from_str_name(name)
            .map(|u| u as i32)
            .ok_or_else(|| format!("{at}: unknown unit '{name}'")),
        Some(Value::Number(n)) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .filter(|n| Unit::try_from(*n).is_ok())
            .ok_or_else(|| format!("{at}: unknown unit {n}")),
        Some(_) => Err(format!("{at}: expected a unit name")),
    }
}

/// Parses a RateLimitRequest from JSON.
pub fn request_from_json(body: &[u8]) -> Result<RateLimitRequest, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
    request_from_value(&value)
}

/// A RateLimitRequest from JSON already parsed (a body read once for
/// several purposes).
pub(super) fn request_from_value(value: &Value) -> Result<RateLimitRequest, String> {
    let obj = object(value, "request")?;
    let f = fields(
        obj,
        &[
            ("domain", "domain"),
            ("descriptors", "descriptors"),
            ("hitsAddend", "hits_addend"),
        ],
        "request",
    )?;
    let mut descriptors = Vec::new();
    if let Some(list) = f[1].filter(|v| !v.is_null()) {
        let list = list.as_array().ok_or("descriptors: expected a list")?;
        for (i, d) in list.iter().enumerate() {
            let at = format!("descriptors[{i}]");
            let d = object(d, &at)?;
            let g = fields(
                d,
                &[
                    ("entries", "entries"),
                    ("limit", "limit"),
                    ("hitsAddend", "hits_addend"),
                    ("isNegativeHits", "is_negative_hits"),
                ],
                &at,
            )?;
            let mut entries = Vec::new();
            if let Some(list) = g[0].filter(|v| !v.is_null()) {
                let list = list
                    .as_array()
                    .ok_or_else(|| format!("{at}.entries: expected a list"))?;
                for (j, e) in list.iter().enumerate() {
                    let eat = format!("{at}.entries[{j}]");
                    let e = object(e, &eat)?;
                    let h = fields(e, &[("key", "key"), ("value", "value")], &eat)?;
                    entries.push(Entry {
                        key: string(h[0], &format!("{eat}.key"))?,
                        value: string(h[1], &format!("{eat}.value"))?,
                    });
                }
            }
            let limit = match g[1].filter(|v| !v.is_null()) {
                None => None,
                Some(l) => {
                    let lat = format!("{at}.limit");
                    let l = object(l, &lat)?;
                    let h = fields(
                        l,
                        &[("requestsPerUnit", "requests_per_unit"), ("unit", "unit")],
                        &lat,
                    )?;
                    Some(RateLimitOverride {
                        requests_per_unit: u32_field(h[0], &format!("{lat}.requestsPerUnit"))?,
                        unit: unit(h[1], &format!("{lat}.unit"))?,
                    })
                }
            };
            let hits_addend =
                integer(g[2], &format!("{at}.hitsAddend"))?.map(|value| UInt64Value { value });
            let is_negative_hits = match g[3] {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(format!("{at}.isNegativeHits: expected true or false")),
            };
            descriptors.push(RateLimitDescriptor {
                entries,
                limit,
                hits_addend,
                is_negative_hits,
            });
        }
    }
    Ok(RateLimitRequest {
        domain: string(f[0], "domain")?,
        descriptors,
        hits_addend: u32_field(f[2], "hitsAddend")?,
    })
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

/// Writes a RateLimitResponse as JSON.
pub(super) fn response_to_json(r: &RateLimitResponse) -> Value {
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut status =
                json!({ "code": code_name(s.code), "limitRemaining": s.limit_remaining });
            if let Some(l) = &s.current_limit {
                status["currentLimit"] = json!({
                    "name": l.name,
                    "requestsPerUnit": l.requests_per_unit,
                    "unit": Unit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name()),
                });
            }
            if let Some(d) = &s.duration_until_reset {
                status["durationUntilReset"] = json!(proto3_duration(d.seconds, d.nanos));
            }
            status
        })
        .collect();
    let headers: Vec<Value> = r
        .response_headers_to_add
        .iter()
        .map(|h| json!({ "key": h.key, "value": h.value }))
        .collect();
    let mut out = json!({
        "overallCode": code_name(r.overall_code),
        "statuses": statuses,
        "responseHeadersToAdd": headers,
    });
    // Only when there are some (soft limits over), as proto3's JSON leaves
    // an empty list out: other answers read as before.
    if !r.request_headers_to_add.is_empty() {
        out["requestHeadersToAdd"] = r
            .request_headers_to_add
            .iter()
            .map(|h| json!({ "key": h.key, "value": h.value }))
            .collect();
    }
    out
}

/// A Duration in proto3's JSON mapping: seconds with 0, 3, 6 or 9
/// fractional digits and an `s` (`29.144698s`, not a float's
/// `29.144697999999998s`).
fn proto3_duration(seconds: i64, nanos: i32) -> String {
    let negative = seconds < 0 || nanos < 0;
    let (seconds, nanos) = (seconds.unsigned_abs(), nanos.unsigned_abs());
    let sign = if negative { "-" } else { "" };
    if nanos == 0 {
        format!("{sign}{seconds}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{sign}{seconds}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{sign}{seconds}.{:06}s", nanos / 1_000)
    } else {
        format!("{sign}{seconds}.{nanos:09}s")
    }
}

#[cfg(test)]
mod duration_tests {
    use super::proto3_duration;

    #[test]
    fn durations_have_0_3_6_or_9_fractional_digits() {
        assert_eq!(proto3_duration(29, 144_698_000), "29.144698s");
        assert_eq!(proto3_duration(29, 144_697_999), "29.144697999s");
        assert_eq!(proto3_duration(1, 500_000_000), "1.500s");
        assert_eq!(proto3_duration(3, 0), "3s");
        assert_eq!(proto3_duration(0, 1), "0.000000001s");
        assert_eq!(proto3_duration(-1, -500_000_000), "-1.500s");
    }
}
