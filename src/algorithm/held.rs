//! Held IDs: in-flight caps and reserved budgets, as pure functions of
//! `(held, state, quota, now, id, hits)`.
//!
//! A key's held IDs are a short list (see [`Held`]): an in-flight cap's
//! requests in progress, a budget's reservations not yet settled. Each
//! entry names its request (Envoy's `x-request-id`), so the stream-end call
//! frees or settles that request's own hold and nobody else's: a refused
//! request's stream-end call, a second release, or an ID never admitted
//! changes nothing. Every entry lapses by itself (`until`): an in-flight
//! slot after the rule's `max_hold_seconds`, a reservation when the window
//! it was charged to ends. The list is bounded by the limit: an in-flight
//! cap holds at most `limit` IDs, and every reservation holds at least one
//! hit of a budget that admits at most `limit` (see [`reserve`]).
//!
//! Times are in ticks (see the module docs of `algorithm`).

use super::fixed_window;
use super::quota::{NANOS_PER_TICK, Outcome, Quota, State, clamp_u32};
use crate::clock::Nanos;

/// One held ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The request's ID, as Envoy sent it; shared, so that a call copies a
    /// list of them without copying each ID.
    pub id: std::sync::Arc<[u8]>,
    /// What it holds: 1 for an in-flight slot, the hits reserved otherwise.
    pub amount: u64,
    /// When the hold lapses by itself (ticks).
    pub until: u64,
}

/// What a call does to a key's held IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOp {
    /// Take an in-flight slot for the ID (`request_id` on `in_flight`).
    Take,
    /// Free the ID's slot (`release`); always admitted.
    Release,
    /// Reserve the hits for the ID (`request_id` on `reserve: true`).
    Reserve,
    /// Replace the ID's reservation by its real cost (`settle`); always
    /// admitted.
    Settle,
}

impl HoldOp {
    /// Whether the call reports what already happened, so it is always
    /// admitted and applied, whatever the request's other checks decide.
    pub fn is_after_the_fact(self) -> bool {
        matches!(self, HoldOp::Release | HoldOp::Settle)
    }

    /// The descriptor entry key that asks for this operation.
    pub fn entry_key(self) -> &'static str {
        match self {
            HoldOp::Take | HoldOp::Reserve => "request_id",
            HoldOp::Release => "release",
            HoldOp::Settle => "settle",
        }
    }
}

/// The outcome of a call on held IDs: the answer, the counter's new state
/// (reservations) and the new list, each `None` when unchanged. Times in
/// nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldOutcome {
    /// The answer (its `commit` is the counter's, as for every algorithm).
    pub outcome: Outcome,
    /// The new list of held IDs and when the whole list lapses (ns), when
    /// it changed; an empty list deletes it.
    pub held: Option<(Vec<Held>, Nanos)>,
}

fn live(held: &[Held], now: u64) -> impl Iterator<Item = &Held> + Clone {
    held.iter().filter(move |h| h.until > now)
}

fn lapses(held: &[Held]) -> Nanos {
    held.iter()
        .map(|h| h.until)
        .max()
        .unwrap_or(0)
        .saturating_mul(NANOS_PER_TICK)
}

/// An in-flight cap of `limit` slots, each held at most `span` (ns): takes
/// or releases `id`'s slot at `now` (ns). The list is copied only when it
/// changes.
pub fn in_flight(
    held: &[Held],
    op: HoldOp,
    id: &[u8],
    (limit, span): (u32, Nanos),
    now: Nanos,
) -> HeldOutcome {
    let now_t = now / NANOS_PER_TICK;
    let count = live(held, now_t).count();
    let mine = live(held, now_t).any(|h| *h.id == *id);
    let left = |n: usize| clamp_u32(u64::from(limit).saturating_sub(n as u64));
    if op == HoldOp::Release {
        let changed = mine || count != held.len();
        let kept = changed.then(|| kept_but(held, now_t, None, id));
        return HeldOutcome {
            outcome: Outcome {
                allowed: true,
                remaining: left(count - usize::from(mine)),
                wait: 0,
                commit: None,
            },
            held: kept.map(|kept| {
                let at = lapses(&kept);
                (kept, at)
            }),
        };
    }
    // A second take of a held ID is refused: an ID a client can choose
    // must not hold one slot for many requests.
    if mine || count >= limit as usize {
        let soonest = live(held, now_t).map(|h| h.until).min().unwrap_or(now_t);
        return HeldOutcome {
            outcome: Outcome {
                allowed: false,
                remaining: left(count),
                wait: soonest.saturating_sub(now_t).saturating_mul(NANOS_PER_TICK),
                commit: None,
            },
            held: None,
        };
    }
    let mut kept = kept_but(held, now_t, None, &[]);
    kept.push(Held {
        id: id.into(),
        amount: 1,
        until: now_t.saturating_add((span / NANOS_PER_TICK).max(1)),
    });
    let at = lapses(&kept);
    HeldOutcome {
        outcome: Outcome {
            allowed: true,
            remaining: left(kept.len()),
            wait: span,
            commit: None,
        },
        held: Some((kept, at)),
    }
}

/// The live entries of `held` (at `now`, lapsing by `until_max` when
/// given), but `id`'s.
fn kept_but(held: &[Held], now: u64, until_max: Option<u64>, id: &[u8]) -> Vec<Held> {
    held.iter()
        .filter(|h| h.until > now && until_max.is_none_or(|m| h.until <= m) && *h.id != *id)
        .cloned()
        .collect()
}

/// A reserved budget on a fixed window: reserves `hits` for `id`
/// ([`HoldOp::Reserve`]: admitted only if they fit in what is left, at
/// least one hit, and the key holds fewer than `most` reservations) or
/// settles `id`'s reservation at the real cost `hits` ([`HoldOp::Settle`]:
/// the difference refunded or charged; without a reservation, the whole
/// cost charged as a budget charges it). `quota` is the budget's.
pub fn reserve(
    (state, held): (State, &[Held]),
    (op, id, most): (HoldOp, &[u8], u32),
    quota: &Quota,
    now: Nanos,
    hits: u64,
) -> HeldOutcome {
    let window = quota.window_at(now);
    let now_t = now / NANOS_PER_TICK;
    let limit = u64::from(quota.limit);
    // A reservation lapses with the window it was charged to: the counter
    // it could be refunded from ends there.
    let in_window = |h: &&Held| h.until > now_t && h.until <= window.end;
    let count = held.iter().filter(in_window).count();
    let mine = held.iter().filter(in_window).find(|h| *h.id == *id);
    let pruned = count != held.len();
    let used = if state.at == window.index {
        u64::from(state.current)
    } else {
        0
    };
    let wait = (window.end - now_t).saturating_mul(NANOS_PER_TICK);
    let expires = window.end.saturating_mul(NANOS_PER_TICK);
    if op == HoldOp::Reserve {
        let plain = Quota {
            budget: false,
            ..*quota
        };
        let amount = hits.max(1);
        let decided =
            fixed_window::decide(state, &plain.ticked(), window, now_t, plain.hits(amount));
        // In nanoseconds, as every outcome leaves the algorithms.
        let mut outcome = Outcome {
            wait: decided.wait.saturating_mul(NANOS_PER_TICK),
            commit: decided
                .commit
                .map(|(s, at)| (s, at.saturating_mul(NANOS_PER_TICK))),
            ..decided
        };
        // A second reservation for one ID is refused, as a second take; so
        // is one past the most a key holds.
        if mine.is_some() || count >= most as usize {
            outcome.allowed = false;
            outcome.commit = None;
            outcome.remaining = clamp_u32(limit.saturating_sub(used));
        }
        if !outcome.allowed {
            return HeldOutcome {
                outcome,
                held: None,
            };
        }
        let mut kept = kept_but(held, now_t, Some(window.end), &[]);
        kept.push(Held {
            id: id.into(),
            amount,
            until: window.end,
        });
        let at = lapses(&kept);
        return HeldOutcome {
            outcome,
            held: Some((kept, at)),
        };
    }
    // Settle: the real cost, cut to the whole budget as any budget charge.
    let cost = Quota {
        budget: true,
        ..*quota
    }
    .hits(hits)
    .charge;
    let reserved = mine.map_or(0, |h| h.amount);
    let after = (used + cost).saturating_sub(reserved);
    let changed = after != used;
    HeldOutcome {
        outcome: Outcome {
            allowed: true,
            remaining: clamp_u32(limit.saturating_sub(after)),
            wait,
            commit: changed.then(|| {
                let next = State {
                    at: window.index,
                    current: clamp_u32(after),
                    previous: 0,
                };
                (next, expires)
            }),
        },
        held: (mine.is_some() || pruned).then(|| {
            let kept = kept_but(held, now_t, Some(window.end), id);
            let at = lapses(&kept);
            (kept, at)
        }),
    }
}

#[cfg(test)]
#[path = "held_tests.rs"]
mod tests;
