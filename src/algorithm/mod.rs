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
mod held;
mod quota;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use held::{Held, HeldOutcome, HoldOp, in_flight, reserve};
pub use quota::{Hits, MAX_BUCKET_SPAN, NANOS_PER_TICK, Outcome, Quota, State, bucket_span};
pub use sliding_log::{Logged, append};

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

#[cfg(test)]
mod tests;
