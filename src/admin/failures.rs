//! Failed token attempts on the admin port: counted
//! (`tollgate_admin_auth_failures_total`), logged without the token at most
//! once per [`LOG_EVERY`] with how many and the last caller, and throttled
//! per caller address: after `max` failures within `window`, the caller is
//! answered 429 with `Retry-After` until the window ends, without its token
//! being looked at.
//!
//! The callers remembered are bounded (`--admin-auth-max-callers`): when
//! the table is full of callers whose window has not ended, every new
//! caller shares one budget, so an attacker with many addresses cannot grow
//! memory, nor escape the throttle (an operator may then be throttled with
//! them until the windows end).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// At most one summary line this often.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

/// The throttle's bounds (`--admin-auth-*`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FailureLimits {
    /// Failures a caller may make within `window` before it is throttled.
    pub max: u32,
    /// How long failures are remembered.
    pub window: Duration,
    /// The most callers remembered.
    pub callers: usize,
}

impl Default for FailureLimits {
    fn default() -> Self {
        Self {
            max: 10,
            window: Duration::from_secs(60),
            callers: 10_000,
        }
    }
}

/// A caller's failures in its current window.
#[derive(Debug, Clone, Copy)]
struct Recent {
    since: Instant,
    count: u32,
}

#[derive(Debug, Default)]
struct Table {
    callers: HashMap<IpAddr, Recent>,
    /// New callers' shared budget while `callers` is full.
    overflow: Option<Recent>,
    /// When expired windows were last dropped.
    swept: Option<Instant>,
    /// Failures not yet logged, and the last caller among them.
    unlogged: u64,
    last_caller: Option<IpAddr>,
    last_logged: Option<Instant>,
}

/// Failed attempts, per caller.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    limits: FailureLimits,
    table: Mutex<Table>,
    total: AtomicU64,
    throttled: AtomicU64,
}

impl Failures {
    /// None yet, within `limits`.
    pub(crate) fn new(limits: FailureLimits) -> Self {
        Self {
            limits,
            ..Self::default()
        }
    }

    /// How long `caller` must wait when it has failed too often (and counts
    /// the refusal); `None` when its token may be checked.
    pub(crate) fn throttled(&self, caller: IpAddr, now: Instant) -> Option<Duration> {
        let table = self.table.lock();
        let recent = table.callers.get(&caller).copied().or_else(|| {
            (table.callers.len() >= self.limits.callers)
                .then_some(table.overflow)
                .flatten()
        })?;
        let ends = recent.since + self.limits.window;
        if recent.count < self.limits.max || now >= ends {
            return None;
        }
        self.throttled.fetch_add(1, Ordering::Relaxed);
        Some(ends - now)
    }

    /// Counts a failed attempt by `caller`; logs the summary when it is due.
    pub(crate) fn record(&self, caller: IpAddr, now: Instant) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let window = self.limits.window;
        let mut table = self.table.lock();
        let full = table.callers.len() >= self.limits.callers;
        if full
            && !table.callers.contains_key(&caller)
            && table
                .swept
                .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
        {
            table.swept = Some(now);
            table
                .callers
                .retain(|_, r| now.duration_since(r.since) < window);
        }
        let bump = |r: &mut Recent| {
            if now.duration_since(r.since) >= window {
                *r = Recent {
                    since: now,
                    count: 0,
                };
            }
            r.count = r.count.saturating_add(1);
        };
        if let Some(r) = table.callers.get_mut(&caller) {
            bump(r);
        } else if table.callers.len() < self.limits.callers {
            table.callers.insert(
                caller,
                Recent {
                    since: now,
                    count: 1,
                },
            );
        } else {
            let r = table.overflow.get_or_insert(Recent {
                since: now,
                count: 0,
            });
            bump(r);
        }
        table.unlogged += 1;
        table.last_caller = Some(caller);
        if table
            .last_logged
            .is_none_or(|t| now.duration_since(t) >= LOG_EVERY)
        {
            log(&mut table, now);
        }
    }

    /// Logs failures not yet logged, when the last line is old enough: a
    /// flood's tail is reported even when it stops.
    pub(crate) fn flush(&self, now: Instant) {
        let mut table = self.table.lock();
        if table.unlogged > 0
            && table
                .last_logged
                .is_none_or(|t| now.duration_since(t) >= LOG_EVERY)
        {
            log(&mut table, now);
        }
    }

    /// Failed attempts so far (`tollgate_admin_auth_failures_total`).
    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Attempts answered 429 so far (`tollgate_admin_auth_throttled_total`).
    pub(crate) fn throttled_total(&self) -> u64 {
        self.throttled.load(Ordering::Relaxed)
    }

    /// Callers remembered now.
    #[cfg(test)]
    fn callers(&self) -> usize {
        self.table.lock().callers.len()
    }
}

fn log(table: &mut Table, now: Instant) {
    tracing::warn!(
        failures = table.unlogged,
        last_caller = %table.last_caller.map_or_else(|| "unknown".to_owned(), |c| c.to_string()),
        "admin: requests with a wrong or missing bearer token (the tokens are not logged)"
    );
    table.unlogged = 0;
    table.last_logged = Some(now);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u32) -> IpAddr {
        IpAddr::from(n.to_be_bytes())
    }

    #[test]
    fn a_caller_is_throttled_after_max_failures_until_its_window_ends() {
        let failures = Failures::new(FailureLimits {
            max: 3,
            window: Duration::from_secs(60),
            callers: 100,
        });
        let t0 = Instant::now();
        for i in 0..3 {
            assert_eq!(failures.throttled(ip(1), t0), None, "{i}");
            failures.record(ip(1), t0);
        }
        let wait = failures
            .throttled(ip(1), t0 + Duration::from_secs(20))
            .expect("throttled");
        assert_eq!(wait, Duration::from_secs(40));
        assert_eq!(failures.throttled(ip(2), t0), None, "another caller");
        assert_eq!(
            failures.throttled(ip(1), t0 + Duration::from_secs(60)),
            None
        );
        assert_eq!((failures.total(), failures.throttled_total()), (3, 1));
    }

    #[test]
    fn callers_are_bounded_and_the_overflow_shares_one_budget() {
        let failures = Failures::new(FailureLimits {
            max: 2,
            window: Duration::from_secs(60),
            callers: 10,
        });
        let t0 = Instant::now();
        for n in 0..10_000 {
            failures.record(ip(n), t0);
        }
        assert_eq!(failures.callers(), 10);
        assert!(failures.throttled(ip(123_456), t0).is_some(), "overflow");
        // Once the windows end, new callers have room again.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(failures.throttled(ip(123_456), later), None);
        failures.record(ip(123_456), later);
        assert_eq!(failures.callers(), 1);
    }
}
