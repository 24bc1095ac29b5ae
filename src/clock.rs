//! Where time comes from. Everything below the gRPC layer takes time as a
//! value ([`Nanos`] since the Unix epoch), so tests jump the clock instead of
//! sleeping, and windows line up with wall-clock minutes, hours and days as
//! they do in the reference service.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch.
pub type Nanos = u64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// The current time in nanoseconds since the Unix epoch.
    fn now(&self) -> Nanos;
}

/// The wall clock. Wall time (not a monotonic clock) because windows are
/// aligned to calendar units and, with Redis, shared between machines.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        // A clock set before 1970 is a broken host; treat it as the epoch
        // rather than panicking on the request path.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as Nanos)
    }
}

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Nanos) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_nanos() as Nanos, Ordering::SeqCst);
    }

    /// Sets the clock to `to`.
    pub fn set(&self, to: Nanos) {
        self.now.store(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}
