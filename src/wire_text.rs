//! Text from the wire, whatever its bytes.
//!
//! Envoy copies request headers into descriptors byte for byte, so a
//! descriptor value (or a quota bucket's) can be any bytes, while protobuf's
//! `string` must be UTF-8. Refusing such a request would let the client
//! through (Envoy fails open on an error by default), so Tollgate reads
//! these fields as bytes and makes them text losslessly:
//!
//! - UTF-8 that does not begin with [`MARKER`] is kept as it is (every value
//!   a rule can name, and all but a hostile client's);
//! - anything else is [`MARKER`] followed by the bytes with each byte that is
//!   not part of valid UTF-8 written `\xHH` and each backslash `\\`.
//!
//! The mapping is injective (the two forms are told apart by the marker, and
//! the escaped form decodes unambiguously), so distinct bytes stay distinct
//! counters on every store, and the escaped form is readable in logs and
//! the admin view: `x-user: mallory\xff` is counted and shown as
//! `\u{FFFD}mallory\xff`.

/// A key and a value as protobuf carries them in a descriptor's entry or a
/// map's pair (`key = 1`, `value = 2`), read as bytes: the same wire form
/// as two `string` fields, whatever the bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct BytesPair {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) value: Vec<u8>,
}

/// Begins every value that was not plain UTF-8 on the wire (U+FFFD, the
/// replacement character, which is what a reader would show there anyway).
pub(crate) const MARKER: char = '\u{FFFD}';

/// Whether `text` begins with [`MARKER`] (compared as bytes: `starts_with`
/// of a char encodes it at every call, and every request's texts are
/// asked).
#[inline]
pub(crate) fn is_marked(text: &str) -> bool {
    const BYTES: &[u8] = "\u{FFFD}".as_bytes();
    text.as_bytes().starts_with(BYTES)
}

/// `bytes` as text, losslessly (see the module's doc). Valid UTF-8 not
/// beginning with the marker is taken without a copy.
pub(crate) fn from_wire(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(text) if !is_marked(&text) => text,
        Ok(text) => escaped(text.as_bytes()),
        Err(e) => escaped(e.as_bytes()),
    }
}

/// A rule's value as it must be written to match what [`from_wire`] makes of
/// the same bytes: itself, unless it begins with the marker.
pub(crate) fn of_rule(value: &str) -> std::borrow::Cow<'_, str> {
    if is_marked(value) {
        std::borrow::Cow::Owned(escaped(value.as_bytes()))
    } else {
        std::borrow::Cow::Borrowed(value)
    }
}

/// How many bytes [`from_wire`] made `text` from, when that is more than
/// `max` (`None`: at most `max`). A text is never shorter than its bytes
/// (the marker and the escapes only add), so a text of at most `max` bytes
/// is answered without reading it: every request's texts are checked.
#[inline]
pub(crate) fn wire_len_over(text: &str, max: usize) -> Option<usize> {
    if text.len() <= max {
        return None;
    }
    Some(to_wire(text).len()).filter(|&n| n > max)
}

/// The bytes [`from_wire`] made `text` from: `text` itself, unless it
/// begins with the marker (the way back, for answers that must name what
/// the client sent, such as a quota bucket).
pub(crate) fn to_wire(text: &str) -> std::borrow::Cow<'_, [u8]> {
    let Some(escaped) = text.strip_prefix(MARKER) else {
        return std::borrow::Cow::Borrowed(text.as_bytes());
    };
    let mut out = Vec::with_capacity(escaped.len());
    let mut rest = escaped.as_bytes();
    while let Some((&b, after)) = rest.split_first() {
        rest = after;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        match rest {
            [b'\\', after @ ..] => {
                out.push(b'\\');
                rest = after;
            }
            [b'x', h, l, after @ ..] => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(*h), hex(*l)) {
                    (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                    // Never made by `from_wire`: kept as written.
                    _ => out.extend_from_slice(&[b'\\', b'x', *h, *l]),
                }
                rest = after;
            }
            _ => out.push(b'\\'),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Whether `c` does not show as itself (so logs, the admin page and
/// `tollgate top` write it escaped): Unicode's Cc, Cf, Zl and Zp, and
/// blanks that are letters or marks.
pub(crate) fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            u32::from(c),
            // Cf (format), Unicode 16.
            0xAD | 0x600..=0x605
                | 0x61C
                | 0x6DD
                | 0x70F
                | 0x890..=0x891
                | 0x8E2
                | 0x180E
                | 0x200B..=0x200F
                | 0x202A..=0x202E
                | 0x2060..=0x2064
                | 0x2066..=0x206F
                | 0xFEFF
                | 0xFFF9..=0xFFFB
                | 0x110BD
                | 0x110CD
                | 0x13430..=0x1343F
                | 0x1BCA0..=0x1BCA3
                | 0x1D173..=0x1D17A
                | 0xE0001
                | 0xE0020..=0xE007F
                // Zl, Zp.
                | 0x2028..=0x2029
                // Blank: the grapheme joiner, Hangul fillers, variation
                // selectors, the braille blank.
                | 0x34F
                | 0x115F..=0x1160
                | 0x3164
                | 0xFFA0
                | 0xFE00..=0xFE0F
                | 0xE0100..=0xE01EF
                | 0x2800
        )
}

/// The marker, then `bytes` with invalid bytes as `\xHH` and backslashes
/// doubled.
fn escaped(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 8);
    out.push(MARKER);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_bound_counts_the_bytes_a_text_was_made_from() {
        assert_eq!(wire_len_over("abcd", 4), None);
        assert_eq!(wire_len_over("abcde", 4), Some(5));
        // Four bytes of 0xff: a text of 3 + 16 bytes, within a bound of 4.
        let text = from_wire(vec![0xff; 4]);
        assert_eq!(text.len(), 19);
        assert_eq!(wire_len_over(&text, 4), None);
        assert_eq!(wire_len_over(&text, 3), Some(4));
        assert_eq!(wire_len_over(&from_wire(vec![0xff; 5]), 4), Some(5));
    }

    proptest! {
        /// A text is never shorter than the bytes it was made from, so the
        /// bound's shortcut (a text within it is) never misses one.
        #[test]
        fn a_text_is_never_shorter_than_its_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in 0usize..80) {
            let text = from_wire(bytes.clone());
            prop_assert!(text.len() >= bytes.len());
            let over = (bytes.len() > max).then_some(bytes.len());
            prop_assert_eq!(wire_len_over(&text, max), over);
        }
    }

    #[test]
    fn utf8_is_kept_and_other_bytes_are_escaped_after_the_marker() {
        assert_eq!(from_wire(b"alice".to_vec()), "alice");
        assert_eq!(from_wire("zoë".as_bytes().to_vec()), "zoë");
        assert_eq!(from_wire(b"mallory\xff".to_vec()), "\u{FFFD}mallory\\xff");
        assert_eq!(from_wire(b"a\\b\x80".to_vec()), "\u{FFFD}a\\\\b\\x80");
        // A lone continuation byte, a truncated sequence, an overlong form.
        assert_eq!(from_wire(vec![0xe2, 0x82]), "\u{FFFD}\\xe2\\x82");
        assert_eq!(from_wire(vec![0xc0, 0xaf]), "\u{FFFD}\\xc0\\xaf");
        // Valid UTF-8 that begins with the marker is escaped too, so it
        // cannot pose as another client's escaped bytes.
        let posing = "\u{FFFD}mallory\\xff";
        assert_ne!(from_wire(posing.as_bytes().to_vec()), posing);
        assert_eq!(of_rule(posing), from_wire(posing.as_bytes().to_vec()));
        assert_eq!(of_rule("alice"), "alice");
    }

    proptest! {
        /// Distinct bytes are distinct text.
        #[test]
        fn distinct_bytes_stay_distinct(
            values in proptest::collection::vec(
                prop_oneof![
                    proptest::collection::vec(any::<u8>(), 0..12),
                    "[a\\\\\u{FFFD}x0-9f]{0,8}".prop_map(String::into_bytes),
                ],
                1..40,
            )
        ) {
            let mut seen: HashMap<String, Vec<u8>> = HashMap::new();
            for bytes in values {
                let text = from_wire(bytes.clone());
                prop_assert_eq!(&*to_wire(&text), &bytes[..], "the way back");
                if let Some(earlier) = seen.insert(text.clone(), bytes.clone()) {
                    prop_assert_eq!(&earlier, &bytes, "{:?} and {:?} both became {:?}", earlier, bytes, text);
                }
            }
        }
    }
}
