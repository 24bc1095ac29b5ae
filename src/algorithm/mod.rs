//! The three limiting algorithms, as pure functions of
//! `(state, quota, now, hits)`.
//!
//! Each returns an [`Outcome`]: whether the hits are admitted, what is left,
//! how long until the limit resets (or, when denied, until a request would be
//! admitted again), and, only when something changed, the state to store and
//! when that state stops mattering. The memory store runs these functions; the
//! Redis scripts compute the same integers (see "Time and exactness").
//!
//! A denied request never changes the state: a refused call spends nothing,
//! which is what makes the limiter's all-or-nothing rule possible.
//!
//! `hits == 0` is a check: the outcome says whether one more hit would be
//! admitted, and nothing is committed.
//!
//! # Hostile numbers
//!
//! `hits` comes from the client and may be anything up to `u64::MAX`. A cost
//! above what the limit could ever admit (the limit for the windows, the
//! burst for the token bucket) is refused before any arithmetic, so every
//! sum below stays small; the rest is checked or done in `u128`. A counter
//! never goes down and a refused request never changes the state.
//!
//! # Time and exactness
//!
//! Interfaces take nanoseconds, but the algorithms count in microseconds
//! ([`NANOS_PER_TICK`]): Redis's Lua has only doubles, which hold integers
//! exactly up to 2^53, and 2^53 µs is 285 years since 1970. Every quantity
//! the scripts form stays below 2^53 (the sliding window weighs the previous
//! window in at most 2^19 steps, the token bucket spans at most
//! [`MAX_BUCKET_SPAN`]), so the memory store and Redis reach the same
//! decisions, remaining counts and waits for every input; a differential
//! test against a real Redis keeps it so.

mod fixed_window;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use sliding_log::{Logged, append};

use crate::calendar::{Calendar, Window};
use crate::clock::Nanos;

/// Which algorithm a limit uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// One counter per calendar window; up to twice the limit across a boundary.
    FixedWindow,
    /// The previous window, weighted by how much of it is still inside the
    /// last period, plus the current one.
    SlidingWindow,
    /// A bucket of `burst` tokens refilled at `limit` per period, as GCRA
    /// (one timestamp per key).
    TokenBucket,
    /// Every admitted request kept with its time: exact, one entry per
    /// admitted request in the last period (its state is a log, see
    /// [`Algorithm::decide_log`]).
    SlidingLog,
}

impl Algorithm {
    /// Every algorithm, in the order the docs list them.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::SlidingLog,
    ];

    /// The name used in rule files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingLog => "sliding_log",
        }
    }

    /// Parses a name as written in rule files.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Decides `hits` against `quota` at `now`, from `state`. A sliding
    /// log's state is its log: [`Algorithm::decide_log`] (here, an empty
    /// one).
    pub fn decide(self, state: State, quota: &Quota, now: Nanos, hits: u64) -> Outcome {
        let ticked = quota.ticked();
        let window = quota.window_at(now);
        let now = now / NANOS_PER_TICK;
        let hits = quota.hits(hits);
        let out = match self {
            Algorithm::FixedWindow => fixed_window::decide(state, &ticked, window, now, hits),
            Algorithm::SlidingWindow => sliding_window::decide(state, &ticked, window, now, hits),
            Algorithm::TokenBucket => token_bucket::decide(state, &ticked, now, hits),
            Algorithm::SlidingLog => sliding_log::decide(&[], &ticked, now, hits),
        };
        in_nanos(out)
    }

    /// Decides `hits` against a sliding log's `quota` at `now`, from `log`
    /// (oldest first, times in ticks). An admission's commit is an append:
    /// its state's `at` (ticks) and `current` (hits), for [`append`].
    pub fn decide_log(log: &[Logged], quota: &Quota, now: Nanos, hits: u64) -> Outcome {
        let out = sliding_log::decide(log, &quota.ticked(), now / NANOS_PER_TICK, quota.hits(hits));
        in_nanos(out)
    }
}

/// An outcome's times (ticks, as the algorithms count) in nanoseconds.
fn in_nanos(mut out: Outcome) -> Outcome {
    out.wait = out.wait.saturating_mul(NANOS_PER_TICK);
    if let Some((_, expires)) = &mut out.commit {
        *expires = expires.saturating_mul(NANOS_PER_TICK);
    }
    out
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

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
    fn ticked(&self) -> Quota {
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
pub(crate) fn cost(hits: u64) -> u64 {
    hits.max(1)
}

/// Saturating conversion for counts that are stored in 32 bits.
fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
