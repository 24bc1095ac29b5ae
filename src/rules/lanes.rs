//! `lanes` on a descriptor: priority lanes sharing its counter (see
//! [`Lanes`]), checked against the node they share.

use serde_saphyr::Spanned;

use super::error::ErrorSink;
use super::file::{RawLanes, at};
use super::matcher::{Lanes, Node};

/// A descriptor's `lanes`, checked against the node they share: its
/// counted limits, its key and its children's keys.
pub(super) fn compile(
    (path, key): (&str, &str),
    raw: Spanned<RawLanes>,
    node: &Node,
    err: ErrorSink<'_>,
) -> Option<Lanes> {
    let pos = at(&raw.referenced);
    let mut failed = false;
    let mut err = |pos: Option<(u32, u32)>, msg: String| {
        failed = true;
        err(pos, msg);
    };
    if !node.rules.iter().any(|r| r.limit.is_some()) {
        err(
            pos,
            format!("lanes on '{path}' share its limit, and it has none (give it rate_limit)"),
        );
    }
    let lane_key = match raw.value.key.map(|k| k.0) {
        Some(k) if !k.is_empty() => crate::wire_text::of_rule(&k).into_owned(),
        _ => {
            err(
                pos,
                format!("lanes on '{path}' need a key (`key:`, the entry that names the lane)"),
            );
            String::new()
        }
    };
    if lane_key == key {
        err(
            pos,
            format!(
                "the lane key of '{path}' is its own key '{key}'; name the lane with another entry"
            ),
        );
    }
    if node.children.keys.contains_key(lane_key.as_str()) {
        err(
            pos,
            format!(
                "the lane key '{lane_key}' of '{path}' is also a child descriptor's key: a request could mean either"
            ),
        );
    }
    let shares = raw.value.shares.unwrap_or_default();
    if shares.is_empty() {
        err(
            pos,
            format!("lanes on '{path}' need shares (`shares: {{LANE: PERCENT}}`)"),
        );
    }
    let mut out = hashbrown::HashMap::with_capacity(shares.len());
    for (lane, share) in shares {
        let share_pos = at(&share.referenced).or(pos);
        if lane.is_empty() {
            err(share_pos, format!("a lane of '{path}' has an empty name"));
        }
        match u8::try_from(share.value.0) {
            Ok(percent @ 1..=100) => {
                out.insert(
                    crate::wire_text::of_rule(&lane).into_owned().into(),
                    percent,
                );
            }
            _ => err(
                share_pos,
                format!(
                    "lane '{lane}' of '{path}' has a share of {}%; a share is 1 to 100",
                    share.value.0
                ),
            ),
        }
    }
    (!failed).then(|| Lanes {
        key: lane_key.into(),
        shares: out,
    })
}
