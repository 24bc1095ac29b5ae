//! One `rate_limit` block (or one entry of `rate_limits`) validated into a
//! [`Limit`]: the reference's fields, then Tollgate's (algorithm, burst,
//! failure mode, unit multiplier, calendar, budget). Every problem is
//! reported with its place; `None` means at least one was.

use super::error::ErrorSink;
use super::file::RawRateLimit;
use super::file::at;
use super::{FailureMode, Limit, LoadOptions, MAX_PERIOD_SECONDS, Unit};
use crate::algorithm::Algorithm;
use crate::calendar::Zone;

/// The limit of `rl` (on the descriptor `path`, written at `pos`), or `None`
/// for `unlimited: true` and after reporting a problem (the caller tells
/// them apart by whether anything was reported).
pub(super) fn compile(
    rl: &RawRateLimit,
    path: &str,
    pos: Option<(u32, u32)>,
    options: &LoadOptions,
    err: ErrorSink<'_>,
) -> Option<Limit> {
    if rl.unlimited.unwrap_or(false) {
        refuse_with_unlimited(rl, path, pos, err);
        return None;
    }
    let unit = unit(rl, path, pos, err);
    let requests_per_unit = rl.requests_per_unit.as_ref().map(|r| r.value.0);
    if requests_per_unit.is_none() {
        err(pos, format!("'{path}' rate_limit has no requests_per_unit"));
    }
    let calendar = rl.calendar.as_ref().is_some_and(|c| c.value);
    let algorithm = algorithm(rl, calendar, path, pos, options, err);
    let burst = burst(rl, requests_per_unit, algorithm, path, pos, err);
    let failure_mode = failure_mode(rl, path, pos, err);
    let unit_multiplier = unit_multiplier(rl, unit, path, pos, err);
    let zone = calendar_zone(rl, path, pos, (unit, algorithm), options, err);
    let mut lease = lease(rl, path, pos, (requests_per_unit, burst), err);
    if lease.is_some_and(|l| l > 0) && rl.budget.as_ref().is_some_and(|b| b.value) {
        err(
            rl.lease.as_ref().and_then(|l| at(&l.referenced)).or(pos),
            format!("'{path}' is a budget, charged after the fact; it cannot be leased"),
        );
        lease = None;
    }

    let (
        Some(unit),
        Some(rpu),
        Some(algorithm),
        Some(burst),
        Some(failure_mode),
        Some(unit_multiplier),
        Some(zone),
        Some(lease),
    ) = (
        unit,
        requests_per_unit,
        algorithm,
        burst,
        failure_mode,
        unit_multiplier,
        zone,
        lease,
    )
    else {
        return None;
    };
    // `tollgate simulate --algorithm`: the same limits under another
    // algorithm. Calendar quotas stay fixed windows; a window has no burst.
    // A log's bound and exactness: a limit a sliding log cannot hold
    // (above --max-sliding-log, or leased) keeps its own algorithm too.
    // A reserved budget keeps its fixed window: reservations are refunded
    // to the window they were charged to.
    let log_fits = rpu <= options.max_sliding_log && lease == 0;
    let reserve = rl.reserve.as_ref().is_some_and(|r| r.value);
    if reserve && !super::held::reserve_fits(rl, path, algorithm, pos, err) {
        return None;
    }
    let (algorithm, burst) = match options.algorithm_override {
        Some(other)
            if zone.is_none()
                && !reserve
                && other != algorithm
                && (other != Algorithm::SlidingLog || log_fits) =>
        {
            (
                other,
                if other == Algorithm::TokenBucket {
                    burst
                } else {
                    rpu
                },
            )
        }
        _ => (algorithm, burst),
    };
    let limit = Limit {
        requests_per_unit: rpu,
        unit,
        unit_multiplier,
        calendar: zone,
        algorithm,
        burst: burst.max(1),
        failure_mode,
        budget: rl.budget.as_ref().is_some_and(|b| b.value),
        lease,
        held: reserve.then_some(super::HeldKind::Reserve),
    };
    // A log keeps an entry per admitted request: millions an hour do not
    // belong in one.
    if algorithm == Algorithm::SlidingLog && rpu > options.max_sliding_log {
        err(
            rl.requests_per_unit
                .as_ref()
                .and_then(|r| at(&r.referenced))
                .or(pos),
            format!(
                "'{path}' is a sliding_log{} of {rpu} requests per {}; a log keeps an entry per admitted request, and the bound is {} (--max-sliding-log; a sliding_window counts large limits in two numbers)",
                if rl.algorithm.is_none() {
                    " (by --default-algorithm)"
                } else {
                    ""
                },
                limit.period_name(),
                options.max_sliding_log
            ),
        );
        return None;
    }
    if algorithm == Algorithm::SlidingLog && lease > 0 {
        err(
            rl.lease.as_ref().and_then(|l| at(&l.referenced)).or(pos),
            format!(
                "'{path}' is a sliding_log, exact by design; it cannot be leased (consistency: exact)"
            ),
        );
        return None;
    }
    // A bucket that takes centuries to refill would overflow the stores'
    // arithmetic; no one means it.
    if algorithm == Algorithm::TokenBucket
        && crate::algorithm::bucket_span(&limit.quota()).is_none()
    {
        err(
            rl.burst.as_ref().and_then(|b| at(&b.referenced)).or(pos),
            format!(
                "'{path}' burst {} at {rpu} per {} takes more than 100 years to refill; lower the burst or raise requests_per_unit",
                limit.burst,
                limit.period_name()
            ),
        );
        return None;
    }
    Some(limit)
}

/// The fields a limit with `unlimited: true` must not set, each reported.
fn refuse_with_unlimited(
    rl: &RawRateLimit,
    path: &str,
    pos: Option<(u32, u32)>,
    err: ErrorSink<'_>,
) {
    for (field, p) in [
        ("unit", rl.unit.as_ref().map(|s| &s.referenced)),
        (
            "requests_per_unit",
            rl.requests_per_unit.as_ref().map(|s| &s.referenced),
        ),
        ("algorithm", rl.algorithm.as_ref().map(|s| &s.referenced)),
        ("burst", rl.burst.as_ref().map(|s| &s.referenced)),
        (
            "unit_multiplier",
            rl.unit_multiplier.as_ref().map(|s| &s.referenced),
        ),
        ("calendar", rl.calendar.as_ref().map(|s| &s.referenced)),
        ("time_zone", rl.time_zone.as_ref().map(|s| &s.referenced)),
        ("budget", rl.budget.as_ref().map(|s| &s.referenced)),
        (
            "consistency",
            rl.consistency.as_ref().map(|s| &s.referenced),
        ),
        ("lease", rl.lease.as_ref().map(|s| &s.referenced)),
        ("reserve", rl.reserve.as_ref().map(|s| &s.referenced)),
    ] {
        if let Some(p) = p {
            err(
                at(p).or(pos),
                format!("'{path}' should not specify rate limit {field} when unlimited is true"),
            );
        }
    }
}

/// Its unit (`None` after reporting a problem).
fn unit(
    rl: &RawRateLimit,
    path: &str,
    pos: Option<(u32, u32)>,
    err: ErrorSink<'_>,
) -> Option<Unit> {
    match &rl.unit {
        None => {
            err(
                pos,
                format!(
                    "'{path}' rate_limit has no unit (one of second, minute, hour, day, week, month, year)"
                ),
            );
            None
        }
        Some(u) => {
            let unit = Unit::from_name(&u.value.0);
            if unit.is_none() {
                err(
                    at(&u.referenced).or(pos),
                    format!(
                        "invalid rate limit unit '{}' in '{path}' (expected second, minute, hour, day, week, month or year)",
                        u.value.0
                    ),
                );
            }
            unit
        }
    }
}

/// Its algorithm: the one named, else a calendar quota's fixed window, else
/// the default (`None` after reporting a problem).
fn algorithm(
    rl: &RawRateLimit,
    calendar: bool,
    path: &str,
    pos: Option<(u32, u32)>,
    options: &LoadOptions,
    err: ErrorSink<'_>,
) -> Option<Algorithm> {
    match &rl.algorithm {
        // A calendar quota resets on its boundaries: a fixed window.
        None if calendar => Some(Algorithm::FixedWindow),
        None => Some(options.default_algorithm),
        Some(a) => {
            let alg = Algorithm::from_name(&a.value.0);
            if alg.is_none() {
                err(
                    at(&a.referenced).or(pos),
                    format!(
                        "unknown algorithm '{}' in '{path}' (expected fixed_window, sliding_window, token_bucket or sliding_log)",
                        a.value.0
                    ),
                );
            }
            alg
        }
    }
}

/// Its burst: the one given (token buckets only, at least 1), else the
/// requests per unit (`None` after reporting a problem).
fn burst(
    rl: &RawRateLimit,
    requests_per_unit: Option<u32>,
    algorithm: Option<Algorithm>,
    path: &str,
    pos: Option<(u32, u32)>,
    err: ErrorSink<'_>,
) -> Option<u32> {
    match &rl.burst {
        None => requests_per_unit,
        Some(b) if algorithm != Some(Algorithm::TokenBucket) => {
            err(
                at(&b.referenced).or(pos),
                format!(
                    "'{path}' sets burst, which only token_bucket uses (set `algorithm: token_bucket`)"
                ),
            );
            None
        }
        Some(b) if b.value.0 == 0 => {
            err(
                at(&b.referenced).or(pos),
                format!("'{path}' burst must be at least 1"),
            );
            None
        }
        Some(b) => Some(b.value.0),
    }
}

/// Its failure mode, when it has one (`None` after reporting a problem).
fn failure_mode(
    rl: &RawRateLimit,
    path: &str,
    pos: Option<(u32, u32)>,
    err: ErrorSink<'_>,
) -> Option<Option<FailureMode>> {
    match &rl.failure_mode {
        None => Some(None),
        Some(m) => {
            let mode = FailureMode::from_name(&m.value.0);
            if mode.is_none() {
                err(
                    at(&m.referenced).or(pos),
                    format!(
                        "unknown failure_mode '{}' in '{path}' (expected allow, deny or local)",
                        m.value.0
                    ),
                );
            }
            mode.map(Some)
        }
    }
}

/// Its unit multiplier: at least 1, the period at most 100 years (`None`
/// after reporting a problem).
fn unit_multiplier(
    rl: &RawRateLimit,
    unit: Option<Unit>,
    path: &str,
    pos: Option<(u32, u32)>,
    err: ErrorSink<'_>,
) -> Option<u32> {
    match &rl.unit_multiplier {
        None => Some(1),
        Some(m) if m.value.0 == 0 => {
            err(
                at(&m.referenced).or(pos),
                format!("'{path}' unit_multiplier must be at least 1"),
            );
            None
        }
        Some(m) => match unit {
            Some(unit) if unit.seconds() * u64::from(m.value.0) > MAX_PERIOD_SECONDS => {
                err(
                    at(&m.referenced).or(pos),
                    format!(
                        "'{path}' period of {} {}s is longer than 100 years",
                        m.value.0,
                        unit.name()
                    ),
                );
                None
            }
            _ => Some(m.value.0),
        },
    }
}

/// `Some(Some(zone))` for a valid calendar limit, `Some(None)` for a limit
/// on epoch-aligned periods, `None` after reporting a problem.
fn calendar_zone(
    rl: &RawRateLimit,
    path: &str,
    pos: Option<(u32, u32)>,
    (unit, algorithm): (Option<Unit>, Option<Algorithm>),
    options: &LoadOptions,
    err: ErrorSink<'_>,
) -> Option<Option<&'static Zone>> {
    let calendar = rl.calendar.as_ref().filter(|c| c.value);
    let Some(flag) = calendar else {
        if let Some(tz) = &rl.time_zone {
            err(
                at(&tz.referenced).or(pos),
                format!(
                    "'{path}' sets time_zone without `calendar: true` (only calendar limits use a time zone)"
                ),
            );
            return None;
        }
        return Some(None);
    };
    let here = at(&flag.referenced).or(pos);
    let mut ok = true;
    if let Some(unit) = unit.filter(|u| u.calendar_unit().is_none()) {
        err(
            here,
            format!(
                "'{path}' is a calendar limit per {}; calendar limits count days, weeks, months or years",
                unit.name()
            ),
        );
        ok = false;
    }
    if let Some(algorithm) = algorithm.filter(|a| *a != Algorithm::FixedWindow) {
        err(
            rl.algorithm
                .as_ref()
                .map_or(here, |a| at(&a.referenced).or(pos)),
            format!(
                "'{path}' is a calendar limit with {algorithm}; a calendar quota resets on its boundaries, so it is a fixed_window (drop `algorithm:` or set fixed_window)"
            ),
        );
        ok = false;
    }
    let zone = match &rl.time_zone {
        None => Some(options.time_zone),
        Some(tz) => match Zone::get(&tz.value.0) {
            Ok(zone) => Some(zone),
            Err(why) => {
                err(at(&tz.referenced).or(pos), format!("'{path}': {why}"));
                None
            }
        },
    };
    (ok && zone.is_some()).then_some(zone)
}

/// `Some(0)` for an exact limit, `Some(n)` for `consistency: leased` with
/// `lease: n`, `None` after reporting a problem.
fn lease(
    rl: &RawRateLimit,
    path: &str,
    pos: Option<(u32, u32)>,
    (requests_per_unit, burst): (Option<u32>, Option<u32>),
    err: ErrorSink<'_>,
) -> Option<u32> {
    let leased = match &rl.consistency {
        None => false,
        Some(c) => match c.value.0.as_str() {
            "exact" => false,
            "leased" => true,
            other => {
                err(
                    at(&c.referenced).or(pos),
                    format!("unknown consistency '{other}' in '{path}' (expected exact or leased)"),
                );
                return None;
            }
        },
    };
    match (&rl.lease, leased) {
        (None, false) => Some(0),
        (Some(l), false) => {
            err(
                at(&l.referenced).or(pos),
                format!("'{path}' sets lease without `consistency: leased`"),
            );
            None
        }
        (None, true) => {
            err(
                rl.consistency
                    .as_ref()
                    .and_then(|c| at(&c.referenced))
                    .or(pos),
                format!(
                    "'{path}' is leased but sets no `lease:` (the hits an instance takes at a time)"
                ),
            );
            None
        }
        (Some(l), true) => {
            // A lease above what the limit can ever hold is never granted.
            let most = requests_per_unit.unwrap_or(0).max(burst.unwrap_or(0));
            if l.value.0 == 0 || l.value.0 > most {
                err(
                    at(&l.referenced).or(pos),
                    format!(
                        "'{path}' lease {} must be from 1 to the limit ({most})",
                        l.value.0
                    ),
                );
                return None;
            }
            Some(l.value.0)
        }
    }
}
