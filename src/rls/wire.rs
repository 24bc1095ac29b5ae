//! A decision written straight to the wire as a `RateLimitResponse`.
//!
//! Building the prost message first costs a vector per response and a
//! string per limit name and header, all dropped once encoded, and prost
//! computes a nested message's length again at every level above it: on the
//! memory store about as much as the decision itself. This writes the same bytes prost writes for
//! [`super::to_proto`] (fields in number order, proto3 defaults left out;
//! a test compares the two on generated decisions), from the decision as it
//! is.

use std::sync::Arc;

use crate::clock::Nanos;
use crate::limiter::{AppliedLimit, Deciding, Decision, DescriptorStatus};

use super::{duration, unit_to_proto};

/// Wire types.
const VARINT: u8 = 0;
const LEN: u8 = 2;

/// `RateLimitResponse.Code`, as a varint.
fn code(over_limit: bool) -> u64 {
    super::code(over_limit) as u64
}

fn varint_len(v: u64) -> usize {
    // 7 bits per byte; 0 still takes one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Field numbers here are all below 16: a tag is one byte.
fn put_tag(out: &mut Vec<u8>, field: u8, wire: u8) {
    out.push(field << 3 | wire);
}

/// A varint field, left out when zero (proto3).
fn varint_field_len(v: u64) -> usize {
    if v == 0 { 0 } else { 1 + varint_len(v) }
}

fn put_varint_field(out: &mut Vec<u8>, field: u8, v: u64) {
    if v != 0 {
        put_tag(out, field, VARINT);
        put_varint(out, v);
    }
}

/// A length-delimited field of `len` bytes, tag and length included.
fn len_field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn put_len_header(out: &mut Vec<u8>, field: u8, len: usize) {
    put_tag(out, field, LEN);
    put_varint(out, len as u64);
}

/// A string field, left out when empty (proto3).
fn string_field_len(s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        len_field_len(s.len())
    }
}

fn put_string_field(out: &mut Vec<u8>, field: u8, s: &str) {
    if !s.is_empty() {
        put_len_header(out, field, s.len());
        out.extend_from_slice(s.as_bytes());
    }
}

/// `RateLimit`: requests_per_unit = 1, unit = 2, name = 3.
fn limit_len(l: &AppliedLimit) -> usize {
    varint_field_len(u64::from(l.requests_per_unit))
        + varint_field_len(unit_to_proto(l.unit) as u64)
        + string_field_len(&l.name)
}

/// `google.protobuf.Duration`: seconds = 1, nanos = 2 (both from a
/// `Nanos`, so never negative).
fn duration_parts(n: Nanos) -> (u64, u64) {
    let d = duration(n);
    (d.seconds as u64, d.nanos as u64)
}

fn duration_len(n: Nanos) -> usize {
    let (seconds, nanos) = duration_parts(n);
    varint_field_len(seconds) + varint_field_len(nanos)
}

/// A status's limit with the lengths of its two messages: the limit's and
/// the reset's (sent with a limit only, as `to_proto` does).
type Nested<'a> = Option<(&'a AppliedLimit, usize, usize)>;

fn nested(s: &DescriptorStatus) -> Nested<'_> {
    s.limit
        .as_ref()
        .map(|l| (l, limit_len(l), duration_len(s.reset)))
}

/// `DescriptorStatus`: code = 1, current_limit = 2, limit_remaining = 3,
/// duration_until_reset = 4.
fn status_len(s: &DescriptorStatus, nested: Nested<'_>) -> usize {
    varint_field_len(code(s.over_limit))
        + varint_field_len(u64::from(s.remaining))
        + nested.map_or(0, |(_, limit, reset)| {
            len_field_len(limit) + len_field_len(reset)
        })
}

/// `HeaderValue`: key = 1, value = 2.
fn header_len(key: &str, value: &str) -> usize {
    string_field_len(key) + string_field_len(value)
}

/// The deciding rule's `file:line`, in pieces (no allocation for a UTF-8
/// path): the file, and the line's digits.
fn source_parts(rule: &crate::rules::Rule) -> (std::borrow::Cow<'_, str>, ([u8; 10], usize)) {
    let mut digits = [0u8; 10];
    let mut n = rule.source.line;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    digits[..len].reverse();
    (rule.source.file.to_string_lossy(), (digits, len))
}

/// `google.protobuf.Value` holding a string (`string_value` = 3).
fn string_value_len(len: usize) -> usize {
    len_field_len(len)
}

/// A `Struct` entry (key = 1, value = 2) of a value `value_len` long.
fn entry_len(key: &str, value_len: usize) -> usize {
    string_field_len(key) + len_field_len(value_len)
}

/// A `Value` holding a number (`number_value` = 2, a double).
const NUMBER_VALUE_LEN: usize = 1 + 8;

/// The `Struct`'s length: the entries that name the rule (see [`named`])
/// and `remaining` (a number).
fn metadata_len(named: &[u8]) -> usize {
    named.len() + len_field_len(entry_len("remaining", NUMBER_VALUE_LEN))
}

/// The `Struct` entries that name a rule: `rule` (the path), `name` (when
/// the rule has one), `source` (`file:line`).
fn put_named(out: &mut Vec<u8>, rule: &crate::rules::Rule) {
    put_string_entry(out, "rule", &[rule.path.as_bytes()]);
    if let Some(name) = rule.name.as_deref() {
        put_string_entry(out, "name", &[name.as_bytes()]);
    }
    let (file, (digits, n)) = source_parts(rule);
    put_string_entry(out, "source", &[file.as_bytes(), b":", &digits[..n]]);
}

/// Rules whose naming entries a thread has encoded, by the address of the
/// rule (held, so the address is never another rule's).
const NAMED_SLOTS: usize = 64;

/// A rule and its naming entries, encoded.
type Named = Option<(Arc<crate::rules::Rule>, Box<[u8]>)>;

thread_local! {
    static NAMED: std::cell::RefCell<[Named; NAMED_SLOTS]> =
        const { std::cell::RefCell::new([const { None }; NAMED_SLOTS]) };
}

/// `f` of the entries that name `rule`, encoded once per rule and thread
/// (every answer the rule decides carries the same: encoding them each
/// time was about 700 instructions an answer). A slot holds the last rule
/// that fell in it: a reload's old rules leave as new ones take their
/// slots, at most [`NAMED_SLOTS`] of them per thread.
fn named<R>(rule: &Arc<crate::rules::Rule>, f: impl FnOnce(&[u8]) -> R) -> R {
    NAMED.with(|cache| {
        let mut cache = cache.borrow_mut();
        let at = Arc::as_ptr(rule) as usize;
        let slot = &mut cache[(at >> 4 ^ at >> 12) % NAMED_SLOTS];
        match slot {
            Some((held, bytes)) if Arc::ptr_eq(held, rule) => f(bytes),
            _ => {
                let mut bytes = Vec::with_capacity(128);
                put_named(&mut bytes, rule);
                let (_, bytes) = slot.insert((rule.clone(), bytes.into_boxed_slice()));
                f(bytes)
            }
        }
    })
}

/// A string entry of the `Struct`.
fn put_string_entry(out: &mut Vec<u8>, key: &str, pieces: &[&[u8]]) {
    let len: usize = pieces.iter().map(|p| p.len()).sum();
    put_len_header(out, 1, entry_len(key, string_value_len(len)));
    put_string_field(out, 1, key);
    put_len_header(out, 2, string_value_len(len));
    put_len_header(out, 3, len);
    for piece in pieces {
        out.extend_from_slice(piece);
    }
}

/// The response's `dynamic_metadata` (field 6): what decided the request,
/// which Envoy's rate limit filter passes on as its dynamic metadata
/// (`%DYNAMIC_METADATA(envoy.filters.http.ratelimit:rule)%` in an access
/// log). Keys in order, as readers find them by name.
fn put_metadata(out: &mut Vec<u8>, d: &Deciding) {
    named(&d.rule, |named| {
        put_len_header(out, 6, metadata_len(named));
        out.extend_from_slice(named);
    });
    put_len_header(out, 1, entry_len("remaining", NUMBER_VALUE_LEN));
    put_string_field(out, 1, "remaining");
    put_len_header(out, 2, NUMBER_VALUE_LEN);
    put_tag(out, 2, 1);
    out.extend_from_slice(&f64::from(d.remaining).to_le_bytes());
}

/// The encoded length of the decision's `RateLimitResponse`.
pub(crate) fn encoded_len(d: &Decision) -> usize {
    d.deciding.as_ref().map_or(0, |m| {
        named(&m.rule, |named| len_field_len(metadata_len(named)))
    }) + varint_field_len(code(d.over_limit))
        + d.statuses
            .iter()
            .map(|s| len_field_len(status_len(s, nested(s))))
            .sum::<usize>()
        + headers_len(&d.headers)
        + headers_len(&d.request_headers)
        + d.body.as_deref().map_or(0, string_field_len)
}

/// A list of `HeaderValue` fields.
fn headers_len(headers: &[(&str, String)]) -> usize {
    headers
        .iter()
        .map(|(k, v)| len_field_len(header_len(k, v)))
        .sum()
}

fn put_headers(out: &mut Vec<u8>, field: u8, headers: &[(&str, String)]) {
    for (key, value) in headers {
        put_len_header(out, field, header_len(key, value));
        put_string_field(out, 1, key);
        put_string_field(out, 2, value);
    }
}

/// Appends the decision's `RateLimitResponse` (overall_code = 1,
/// statuses = 2, response_headers_to_add = 3, request_headers_to_add = 4,
/// raw_body = 5, dynamic_metadata = 6) to `out`.
pub(crate) fn encode(d: &Decision, out: &mut Vec<u8>) {
    put_varint_field(out, 1, code(d.over_limit));
    for s in &d.statuses {
        // Each nested length once per status.
        let nested = nested(s);
        put_len_header(out, 2, status_len(s, nested));
        put_varint_field(out, 1, code(s.over_limit));
        if let Some((l, limit_len, _)) = nested {
            put_len_header(out, 2, limit_len);
            put_varint_field(out, 1, u64::from(l.requests_per_unit));
            put_varint_field(out, 2, unit_to_proto(l.unit) as u64);
            put_string_field(out, 3, &l.name);
        }
        put_varint_field(out, 3, u64::from(s.remaining));
        if let Some((_, _, reset_len)) = nested {
            put_len_header(out, 4, reset_len);
            let (seconds, nanos) = duration_parts(s.reset);
            put_varint_field(out, 1, seconds);
            put_varint_field(out, 2, nanos);
        }
    }
    put_headers(out, 3, &d.headers);
    put_headers(out, 4, &d.request_headers);
    // `raw_body` (bytes: written as a string is).
    if let Some(body) = &d.body {
        put_string_field(out, 5, body);
    }
    if let Some(deciding) = &d.deciding {
        put_metadata(out, deciding);
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
