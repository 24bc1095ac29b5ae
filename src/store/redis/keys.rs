//! Redis key names.
//!
//! `tollgate:{api|user=ann|org=acme}:sw:minute:29512345`: the prefix, then the
//! descriptor in a hash tag (so every key of one descriptor lives in one
//! Cluster slot, whatever its limits), the algorithm, the period and, for the
//! windows, the window number. The period is the unit (`minute`), a multiple
//! (`5minute`) or a calendar (`month@Europe/Berlin`, `3month@UTC`), whose
//! windows are numbered consecutively (months since year 0, say).
//!
//! The encoding is injective: in the domain, keys and values, `%` and the
//! characters that structure the name (`|`, `=`, `{`, `}`) are
//! percent-encoded, so a value such as `victim|path=/login` cannot land on
//! another descriptor's counter, and no value can end the hash tag early.
//! The prefix may not contain braces (checked when the store is built).

use crate::algorithm::{Algorithm, HoldOp};
use crate::clock::Nanos;
use crate::store::{Check, CounterKey};

/// The Redis keys of one check: one, or two for the sliding window (the
/// current window's first). The one place that knows how many keys an
/// algorithm has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct KeyNames {
    names: [String; 2],
    len: usize,
}

impl KeyNames {
    /// How many keys a check of `algorithm` has.
    pub(super) fn count(algorithm: Algorithm) -> usize {
        match algorithm {
            Algorithm::SlidingWindow => 2,
            Algorithm::FixedWindow | Algorithm::TokenBucket | Algorithm::SlidingLog => 1,
        }
    }

    /// The keys of `key` in window `window` (see
    /// [`crate::algorithm::Quota::window_at`]).
    pub(super) fn of(prefix: &str, key: &CounterKey, window: u64) -> Self {
        let parts = key.parts();
        let mut base = String::with_capacity(64);
        base.push_str(prefix);
        base.push('{');
        escape_into(&mut base, parts.domain);
        for (k, v) in &parts.entries {
            base.push('|');
            escape_into(&mut base, k);
            base.push('=');
            escape_into(&mut base, v);
        }
        base.push('}');
        base.push(':');
        base.push_str(if parts.in_flight {
            IN_FLIGHT_CODE
        } else {
            algorithm_code(parts.algorithm)
        });
        base.push(':');
        parts
            .unit
            .write_period_name(&mut base, parts.every, parts.zone);
        let numbered = |window: u64| {
            let mut name = String::with_capacity(base.len() + 21);
            name.push_str(&base);
            name.push(':');
            name.push_str(itoa::Buffer::new().format(window));
            name
        };
        if parts.in_flight {
            // An in-flight cap's held IDs: one list, no window, no period
            // (a reload that changes the longest hold keeps the slots).
            let end = base.len() - 1 - base.rsplit(':').next().map_or(0, str::len);
            base.truncate(end);
            return Self {
                names: [base, String::new()],
                len: 1,
            };
        }
        let names = match parts.algorithm {
            Algorithm::FixedWindow => [numbered(window), String::new()],
            Algorithm::SlidingWindow => [numbered(window), numbered(window.saturating_sub(1))],
            Algorithm::TokenBucket | Algorithm::SlidingLog => [base, String::new()],
        };
        Self {
            names,
            len: Self::count(parts.algorithm),
        }
    }

    /// The domain and entries of a counter's name (`prefix` taken off
    /// already): `{domain|k=v|...}:fw:...`, as [`KeyNames::of`] writes it;
    /// `None` for any other key (a call's receipt, the reset epoch, a
    /// malformed escape).
    pub(super) fn parse(name: &str) -> Option<(String, Vec<(String, String)>)> {
        let inner = name.strip_prefix('{')?;
        let end = inner.find('}')?;
        // Counters only (a call's receipt shares the hash tag, not the form).
        let code = inner[end + 1..].strip_prefix(':')?.split(':').next()?;
        if code != IN_FLIGHT_CODE
            && ![
                Algorithm::FixedWindow,
                Algorithm::SlidingWindow,
                Algorithm::TokenBucket,
                Algorithm::SlidingLog,
            ]
            .iter()
            .any(|&a| algorithm_code(a) == code)
        {
            return None;
        }
        let mut parts = inner[..end].split('|');
        let domain = unescape(parts.next()?)?;
        let mut entries = Vec::new();
        for part in parts {
            let (k, v) = part.split_once('=')?;
            entries.push((unescape(k)?, unescape(v)?));
        }
        Some((domain, entries))
    }

    /// A SCAN `MATCH` pattern for every key of `domain` under `prefix`.
    pub(super) fn domain_pattern(prefix: &str, domain: &str) -> String {
        let mut pattern = String::new();
        glob_escape(prefix, &mut pattern);
        pattern.push('{');
        let mut escaped = String::new();
        escape_into(&mut escaped, domain);
        glob_escape(&escaped, &mut pattern);
        pattern.push_str("|*");
        pattern
    }

    /// The keys of `check` at `now`: its counter's (see [`KeyNames::of`]),
    /// and for a reserved budget's call the key of its held IDs after them
    /// (the counter's name and `:h`: one hash tag, one slot).
    pub(super) fn of_check(prefix: &str, check: &Check, now: Nanos) -> Self {
        let mut names = Self::of(prefix, &check.key, check.quota.window_at(now).index);
        if Self::holds_beside(check) {
            names.names[1] = format!("{}:h", names.names[0]);
            names.len = 2;
        }
        names
    }

    /// Whether `check` also has the key of a budget's held IDs.
    fn holds_beside(check: &Check) -> bool {
        check
            .hold
            .as_ref()
            .is_some_and(|h| matches!(h.op, HoldOp::Reserve | HoldOp::Settle))
    }

    /// How many keys [`KeyNames::of_check`] gives `check`.
    pub(super) fn count_of(check: &Check) -> usize {
        if Self::holds_beside(check) {
            2
        } else {
            Self::count(check.algorithm)
        }
    }

    /// The first key (the current window's): the one whose slot is the
    /// check's.
    pub(super) fn first(&self) -> &str {
        &self.names[0]
    }

    /// Each key, the current window's first.
    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = &str> {
        self.names[..self.len].iter().map(String::as_str)
    }

    /// Each key, owned.
    pub(super) fn into_names(self) -> impl Iterator<Item = String> {
        self.names.into_iter().take(self.len)
    }
}

/// The Redis keys of one rate limit quota (RLQS) bucket: its clients'
/// weights per Tollgate instance, and what was admitted in window `window`.
/// Both in one hash tag (one Cluster slot, one script call).
pub(super) fn quota_key_names(
    prefix: &str,
    domain: &str,
    entries: &[(String, String)],
    window: u64,
) -> [String; 2] {
    let mut base = String::with_capacity(64);
    base.push_str(prefix);
    base.push_str("rlqs:{");
    escape_into(&mut base, domain);
    for (k, v) in entries {
        base.push('|');
        escape_into(&mut base, k);
        base.push('=');
        escape_into(&mut base, v);
    }
    base.push('}');
    [format!("{base}:weights"), format!("{base}:used:{window}")]
}

/// Appends `text` with `%`, `|`, `=`, `{` and `}` percent-encoded.
fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '|' => out.push_str("%7C"),
            '=' => out.push_str("%3D"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// Appends `text` with the glob characters of SCAN's MATCH escaped.
fn glob_escape(text: &str, out: &mut String) {
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// The text [`escape_into`] encoded; `None` for a malformed escape.
fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3)?;
        out.push(match code {
            "25" => '%',
            "7C" => '|',
            "3D" => '=',
            "7B" => '{',
            "7D" => '}',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The code of an in-flight cap's held IDs in key names.
const IN_FLIGHT_CODE: &str = "if";

/// Short algorithm names used in key names.
fn algorithm_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "fw",
        Algorithm::SlidingWindow => "sw",
        Algorithm::TokenBucket => "tb",
        Algorithm::SlidingLog => "sl",
    }
}

/// A check's code in the batch script's arguments: its algorithm's, or
/// what it does with a request ID (see `held.lua`).
pub(super) fn check_code(check: &Check) -> u8 {
    match check.hold.as_ref().map(|h| h.op) {
        Some(HoldOp::Take) => b'i',
        Some(HoldOp::Release) => b'o',
        Some(HoldOp::Reserve) => b'r',
        Some(HoldOp::Settle) => b'e',
        None => script_code(check.algorithm).as_bytes()[0],
    }
}

/// The algorithm's code in the scripts' arguments.
pub(super) fn script_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "f",
        Algorithm::SlidingWindow => "s",
        Algorithm::TokenBucket => "t",
        Algorithm::SlidingLog => "l",
    }
}

/// A Redis Cluster hash slot (0 to 16,383).
pub(super) type Slot = u16;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the text
/// between the first `{` and the next `}`, when not empty) or of all of it.
pub(super) fn slot_of(key: &[u8]) -> Slot {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key).unwrap_or(key)) % 16_384
}

/// The hash tag of `key`, as Redis Cluster reads it: the text between the
/// first `{` and the next `}`, when not empty.
pub(super) fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::period::Unit;
    use proptest::prelude::*;
    use redis::cluster_routing::Slot;

    #[test]
    fn names_read_back_their_descriptor_and_other_keys_do_not() {
        let mut key = CounterKey::new("api", Algorithm::SlidingWindow, Unit::Minute);
        key.entry("user", "a|b=c");
        key.entry("path", "/login%");
        let name = KeyNames::of("tollgate:", &key, 5)
            .into_names()
            .next()
            .expect("a name");
        let (domain, entries) = KeyNames::parse(&name["tollgate:".len()..]).expect("parsed");
        assert_eq!(domain, "api");
        assert_eq!(
            entries,
            [
                ("user".into(), "a|b=c".into()),
                ("path".into(), "/login%".into())
            ]
        );
        assert_eq!(
            KeyNames::parse("{api|user=ann}:call:seed.1"),
            None,
            "a receipt"
        );
        assert_eq!(KeyNames::parse("{resets}:epoch"), None);
        assert_eq!(KeyNames::parse("{api|user=a%zz}:fw:minute:1"), None);
        assert_eq!(
            KeyNames::domain_pattern("t*:", "a?[b]"),
            "t\\*:{a\\?\\[b\\]|*"
        );
    }

    #[test]
    fn names_are_readable_and_share_a_slot() {
        let mut key = CounterKey::new("api", Algorithm::SlidingWindow, Unit::Minute);
        key.entry("user", "ann");
        let names = KeyNames::of("tollgate:", &key, 2);
        let [current, previous] = names.iter().collect::<Vec<_>>()[..] else {
            panic!("two keys: {names:?}");
        };
        assert_eq!(current, "tollgate:{api|user=ann}:sw:minute:2");
        assert_eq!(previous, "tollgate:{api|user=ann}:sw:minute:1");
        assert_eq!(Slot::for_key(current), Slot::for_key(previous));
    }

    #[test]
    fn slots_are_the_ones_redis_computes() {
        for key in [
            "",
            "a",
            "{}",
            "{}x",
            "x{}y",
            "{user1000}.following",
            "a{b}{c}",
            "{{a}}",
            "tollgate:{api|user=ann}:fw:minute:9",
        ] {
            assert_eq!(
                Slot::new(slot_of(key.as_bytes())),
                Some(Slot::for_key(key)),
                "{key}"
            );
        }
        // Values from the Redis Cluster specification and CLUSTER KEYSLOT.
        assert_eq!(slot_of(b"123456789"), 12_739);
        assert_eq!(slot_of(b"foo"), 12_182);
    }

    #[test]
    fn a_value_cannot_spell_another_descriptor() {
        let name = |entries: &[(&str, &str)]| {
            let mut key = CounterKey::new("api", Algorithm::FixedWindow, Unit::Minute);
            for (k, v) in entries {
                key.entry(k, v);
            }
            KeyNames::of("tollgate:", &key, 0).first().to_owned()
        };
        let attacker = name(&[("user", "victim|path=/login")]);
        let victim = name(&[("user", "victim"), ("path", "/login")]);
        assert_ne!(attacker, victim);
        // A `}` in a value does not end the hash tag: both keys of a sliding
        // window still share the whole descriptor's slot.
        let braces = name(&[("user", "a}b{c")]);
        assert_eq!(braces, "tollgate:{api|user=a%7Db%7Bc}:fw:minute:0");
    }

    fn descriptor() -> impl Strategy<Value = (String, Vec<(String, String)>)> {
        // Few characters, most of them special, so collisions would be found.
        let text = "[a|=%{}7CD]{0,4}";
        (text, prop::collection::vec((text, text), 1..4))
    }

    proptest! {
        #[test]
        fn distinct_descriptors_never_share_a_key(a in descriptor(), b in descriptor()) {
            let name = |(domain, entries): &(String, Vec<(String, String)>)| {
                let mut key = CounterKey::new(domain, Algorithm::SlidingWindow, Unit::Hour);
                for (k, v) in entries {
                    key.entry(k, v);
                }
                KeyNames::of("tollgate:", &key, 7_200_000_000_000).into_names().collect::<Vec<_>>()
            };
            let (na, nb) = (name(&a), name(&b));
            prop_assert_eq!(a == b, na == nb);
            for n in na.iter().chain(&nb) {
                // One hash tag per name, ending where the descriptor ends.
                prop_assert_eq!(n.matches('{').count(), 1);
                prop_assert_eq!(n.matches('}').count(), 1);
            }
            prop_assert_eq!(Slot::for_key(&na[0]), Slot::for_key(&na[1]));
        }
    }
}
