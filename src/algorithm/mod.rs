//! The three limiting algorithms, as pure functions of
//! `(state, quota, now, hits)`.
//!
//! Each returns an [`Outcome`]: whether the hits are admitted, what is left,
//! how long until the limit resets (or, when denied, until a request would be
//! admitted again), and, only when something changed, the state to store and
//! when that state stops mattering. The memory store runs these functions; the
//! Redis scripts mirror them line for line.
//!
//! A denied request never changes the state: a refused call spends nothing,
//! which is what makes the limiter's all-or-nothing rule possible.
//!
//! `hits == 0` is a check: the outcome says whether one more hit would be
//! admitted, and nothing is committed.

mod fixed_window;
mod sliding_window;
mod token_bucket;

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
}

impl Algorithm {
    /// Every algorithm, in the order the docs list them.
    pub const ALL: [Algorithm; 3] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
    ];

    /// The name used in rule files and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
        }
    }

    /// Parses a name as written in rule files.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Decides `hits` against `quota` at `now`, from `state`.
    pub fn decide(self, state: State, quota: &Quota, now: Nanos, hits: u64) -> Outcome {
        match self {
            Algorithm::FixedWindow => fixed_window::decide(state, quota, now, hits),
            Algorithm::SlidingWindow => sliding_window::decide(state, quota, now, hits),
            Algorithm::TokenBucket => token_bucket::decide(state, quota, now, hits),
        }
    }
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
    /// The period in nanoseconds (the unit). Never zero.
    pub period: Nanos,
    /// Token bucket capacity; ignored by the window algorithms. At least 1.
    pub burst: u32,
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

/// The hits used to decide admission: a check (0) asks about one hit.
fn cost(hits: u64) -> u64 {
    hits.max(1)
}

/// Saturating conversion for counts that are stored in 32 bits.
fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
