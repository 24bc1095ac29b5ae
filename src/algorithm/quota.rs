//! What the algorithms decide with and what they answer: a limit's
//! [`Quota`], a request's [`Hits`], a key's [`State`] and the [`Outcome`],
//! and the units their arithmetic counts in (see the module docs of
//! `algorithm`, "Time and exactness").

use crate::calendar::{Calendar, Window};
use crate::clock::Nanos;

/// What a limit allows: `limit` hits per `period`, and for the token bucket a
/// capacity of `burst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Hits per period (`requests_per_unit`). Zero refuses everything.
    pub limit: u32,
    /// The period in nanoseconds (the unit times its multiplier). Never
    /// zero. For a calendar quota, the nominal length (30-day months).
    pub period: Nanos,
    /// Token bucket capacity; ignored by the window algorithms. At least 1.
    pub burst: u32,
    /// Windows on a time zone's calendar instead of multiples of `period`
    /// since the epoch (fixed window only; rules refuse the others).
    pub calendar: Option<Calendar>,
    /// A usage budget: a request is admitted while anything is left, and its
    /// whole cost is charged (see [`Hits`]).
    pub budget: bool,
}

impl Quota {
    /// `limit` per `period` (nanoseconds), on epoch-aligned windows.
    pub fn new(limit: u32, period: Nanos, burst: u32) -> Self {
        Self {
            limit,
            period,
            burst,
            calendar: None,
            budget: false,
        }
    }

    /// This quota in the algorithms' units: its period in ticks (at least
    /// one), its burst at least one.
    pub(super) fn ticked(&self) -> Quota {
        Quota {
            period: self.period_ticks(),
            burst: self.burst.max(1),
            ..*self
        }
    }

    /// The period in ticks (at least one).
    pub fn period_ticks(&self) -> u64 {
        (self.period / NANOS_PER_TICK).max(1)
    }

    /// The window holding `now`, in ticks (see the module docs): the
    /// calendar's, or the period's multiples since the epoch. Key names
    /// carry its index; the stores pass it to the algorithms.
    pub fn window_at(&self, now: Nanos) -> Window {
        let now = now / NANOS_PER_TICK;
        if let Some(calendar) = &self.calendar {
            return calendar.window(now);
        }
        let period = (self.period / NANOS_PER_TICK).max(1);
        let index = now / period;
        let start = index * period;
        Window {
            index,
            start,
            end: start.saturating_add(period),
        }
    }

    /// What `hits` asks of this quota: what admission needs, and what is
    /// charged when admitted.
    pub fn hits(&self, hits: u64) -> Hits {
        if !self.budget {
            return Hits {
                cost: cost(hits),
                charge: hits,
            };
        }
        // A budget pays for work already done (a response's tokens): any
        // balance admits, and the charge may overdraw it. A charge beyond
        // the whole limit (or burst) is cut to it, so the debt is bounded and
        // every sum stays exact.
        Hits {
            cost: 1,
            charge: hits.min(u64::from(self.limit.max(self.burst))),
        }
    }
}

/// A request's hits as a limit sees them: `cost` must fit for the request to
/// be admitted; `charge` is what admission spends. For ordinary limits the
/// cost is the hits (at least 1: a check of zero hits asks about one) and
/// the charge is the hits; for a budget the cost is 1 and the charge the
/// hits, capped at the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hits {
    /// Admission needs room for this many.
    pub cost: u64,
    /// Admission spends this many (0: a check).
    pub charge: u64,
}

/// Per-key state, 16 bytes whatever the algorithm. Its meaning belongs to the
/// algorithm that wrote it; the all-zero value means "nothing seen yet" for
/// every algorithm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    /// Window number (windows) or theoretical arrival time (token bucket).
    pub at: u64,
    /// Hits in the current window.
    pub current: u32,
    /// Hits in the previous window (sliding window only).
    pub previous: u32,
}

/// The result of one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the hits are admitted.
    pub allowed: bool,
    /// Hits still available after this decision.
    pub remaining: u32,
    /// When admitted: time until the limit resets (the window ends, or the
    /// bucket is full again). When denied: time until one more request of
    /// this size would be admitted, if nothing else arrives.
    pub wait: Nanos,
    /// The state to store and the time after which it no longer matters, or
    /// `None` when nothing changed (denials and checks).
    pub commit: Option<(State, Nanos)>,
}

/// Nanoseconds per unit of the algorithms' arithmetic (a microsecond).
pub const NANOS_PER_TICK: Nanos = 1_000;

/// The longest a token bucket may take to refill from empty (`burst` times
/// the emission interval): 100 years, in ticks. Rules beyond it are refused
/// at load; the algorithm clamps to it so that no input can overflow.
pub const MAX_BUCKET_SPAN: u64 = 100 * 365 * 86_400 * 1_000_000;

/// Ticks a token bucket of `quota` takes to refill from empty, or `None` when
/// that exceeds [`MAX_BUCKET_SPAN`] (`quota` in nanoseconds, as rules hold it).
pub fn bucket_span(quota: &Quota) -> Option<u64> {
    let period = u128::from((quota.period / NANOS_PER_TICK).max(1));
    let interval = (period / u128::from(quota.limit.max(1))).max(1);
    let span = interval * u128::from(quota.burst.max(1));
    u64::try_from(span).ok().filter(|s| *s <= MAX_BUCKET_SPAN)
}

/// The hits used to decide admission: a check (0) asks about one hit.
fn cost(hits: u64) -> u64 {
    hits.max(1)
}

/// Saturating conversion for counts that are stored in 32 bits.
pub(super) fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}
