//! The time units of limits and the longest period: a leaf module, so the
//! stores (whose counter keys carry a unit) need nothing from the rules.

use crate::calendar::CalendarUnit;
use crate::clock::{NANOS_PER_SEC, Nanos};

/// The time unit of a limit, as in Envoy's `RateLimitResponse.RateLimit.Unit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as the reference counts a month.
    Month,
    /// 365 days, as the reference counts a year.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length in seconds.
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The unit's length in nanoseconds.
    pub fn nanos(self) -> Nanos {
        self.seconds() * NANOS_PER_SEC
    }

    /// The name as written in rule files (lower case) and, upper-cased, in protos.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// A period of `every` of this unit, on `zone`'s calendar when given, as
    /// people read it and as Redis key names carry it: `minute`, `5minute`,
    /// `month@Europe/Berlin`.
    pub fn period_name(self, every: u32, zone: Option<&str>) -> String {
        let mut name = String::new();
        self.write_period_name(&mut name, every, zone);
        name
    }

    /// [`Unit::period_name`], appended to `out` (Redis key names are built
    /// per request: no string of its own).
    pub fn write_period_name(self, out: &mut String, every: u32, zone: Option<&str>) {
        if every > 1 {
            out.push_str(itoa::Buffer::new().format(every));
        }
        out.push_str(self.name());
        if let Some(zone) = zone {
            out.push('@');
            out.push_str(zone);
        }
    }

    /// The calendar unit of the same name (day, week, month, year), if any.
    pub fn calendar_unit(self) -> Option<CalendarUnit> {
        match self {
            Unit::Day => Some(CalendarUnit::Day),
            Unit::Week => Some(CalendarUnit::Week),
            Unit::Month => Some(CalendarUnit::Month),
            Unit::Year => Some(CalendarUnit::Year),
            Unit::Second | Unit::Minute | Unit::Hour => None,
        }
    }

    /// Parses a unit name case-insensitively, as the reference does.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(name))
    }
}

/// The longest period a limit may have: beyond it the stores' exact
/// arithmetic would not hold (see [`crate::algorithm`]).
pub const MAX_PERIOD_SECONDS: u64 = 100 * 365 * 86_400;
