//! Generated traffic (`--generate`): the spec, and the requests it makes
//! as they are read ([`Generated`]): the same spec makes the same requests,
//! so a replay can make them again instead of holding them.

use std::sync::Arc;

use super::traffic::Event;
use crate::clock::{NANOS_PER_SEC, Nanos};

/// What `--generate` makes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Generate {
    /// Mean requests per second.
    pub rate: f64,
    /// Seconds of traffic.
    pub seconds: f64,
    /// Distinct clients.
    pub clients: u32,
    /// Zipf exponent of how often each client sends (0: all alike).
    pub zipf: f64,
    /// How bursty: 0 is Poisson; b > 0 sends in on/off periods, `1 + b`
    /// times the rate while on.
    pub burstiness: f64,
    /// The domain of the requests.
    pub domain: String,
    /// The descriptor key the client id goes under.
    pub key: String,
    /// Seed of the random numbers (same seed, same traffic).
    pub seed: u64,
    /// When the traffic starts (Unix seconds).
    pub start: u64,
}

impl Default for Generate {
    fn default() -> Self {
        Self {
            rate: 100.0,
            seconds: 600.0,
            clients: 100,
            zipf: 1.0,
            burstiness: 0.0,
            domain: "api".into(),
            key: "client".into(),
            seed: 1,
            start: 1_767_225_600, // 2026-01-01T00:00:00Z
        }
    }
}

impl std::str::FromStr for Generate {
    type Err = String;

    /// `rate=200,seconds=3600,clients=1000,zipf=1.1,burstiness=2,domain=api,key=client,seed=7`
    fn from_str(text: &str) -> Result<Self, String> {
        let mut g = Generate::default();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not name=value"))?;
            let number = || {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| format!("{name}: '{value}' is not a number of at least 0"))
            };
            match name {
                "rate" => g.rate = number()?,
                "seconds" => g.seconds = number()?,
                "clients" => {
                    let n = number()?;
                    if !(1.0..=10_000_000.0).contains(&n) || n.fract() != 0.0 {
                        return Err(format!(
                            "clients: '{value}' must be a whole number from 1 to 10,000,000"
                        ));
                    }
                    g.clients = n as u32;
                }
                "zipf" => g.zipf = number()?,
                "burstiness" => g.burstiness = number()?,
                "seed" => g.seed = number()? as u64,
                "start" => {
                    let n = number()?;
                    if n >= MAX_UNIX_SECONDS {
                        return Err(format!(
                            "start: '{value}' is not a Unix time in seconds (below {MAX_UNIX_SECONDS})"
                        ));
                    }
                    g.start = n as u64;
                }
                "domain" => g.domain = value.into(),
                "key" => g.key = value.into(),
                other => {
                    return Err(format!(
                        "unknown generator setting '{other}' (rate, seconds, clients, zipf, burstiness, domain, key, seed, start)"
                    ));
                }
            }
        }
        // Timestamps are nanoseconds: a rate above a billion a second, or a
        // duration below a nanosecond, cannot be told apart.
        if !(g.rate > 0.0 && g.rate <= MAX_RATE) {
            return Err(format!(
                "rate: '{}' must be above 0 and at most {MAX_RATE} requests a second",
                g.rate
            ));
        }
        if !(MIN_SECONDS..=MAX_UNIX_SECONDS).contains(&g.seconds) {
            return Err(format!(
                "seconds: '{}' must be from {MIN_SECONDS} to {MAX_UNIX_SECONDS}",
                g.seconds
            ));
        }
        if g.start as f64 + g.seconds >= MAX_UNIX_SECONDS {
            return Err(format!(
                "start + seconds ends after {MAX_UNIX_SECONDS} (Unix seconds)"
            ));
        }
        Ok(g)
    }
}

/// The latest time traffic may have (Unix seconds, as [`parse_time`] takes).
const MAX_UNIX_SECONDS: f64 = 4e9;
/// The highest generated rate (one request a nanosecond).
const MAX_RATE: f64 = 1e9;
/// The shortest generated traffic (a nanosecond).
const MIN_SECONDS: f64 = 1e-9;

impl Generate {
    /// How many requests it makes, about.
    pub(crate) fn expected(&self) -> f64 {
        self.rate * self.seconds
    }
}

/// A small, fast, seedable generator (SplitMix64): traffic must be the same
/// for the same seed on every machine.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// Traffic as `g` describes it, made as it is read: arrivals of a Poisson
/// process (modulated on/off when bursty), each from a client drawn with
/// Zipf weights. The same spec makes the same events, so a replay can read
/// it again instead of keeping it: memory holds the clients, not the
/// events.
pub(crate) struct Generated<'g> {
    g: &'g Generate,
    random: Random,
    /// Cumulative Zipf weights of the clients.
    cumulative: Vec<f64>,
    total: f64,
    names: Vec<Arc<str>>,
    domain: Arc<str>,
    key: Arc<str>,
    /// Seconds since the start.
    t: f64,
    /// On/off periods of 1 to 10 s: on at (1 + b) x rate, off long enough
    /// that the mean stays `rate`.
    on_share: f64,
    period_end: f64,
    on: bool,
}

impl<'g> Generated<'g> {
    pub(crate) fn new(g: &'g Generate) -> Self {
        let mut cumulative = Vec::with_capacity(g.clients as usize);
        let mut total = 0.0;
        for i in 1..=g.clients {
            total += 1.0 / f64::from(i).powf(g.zipf);
            cumulative.push(total);
        }
        Self {
            g,
            random: Random(g.seed),
            cumulative,
            total,
            names: (0..g.clients).map(|i| format!("c{i}").into()).collect(),
            domain: g.domain.as_str().into(),
            key: g.key.as_str().into(),
            t: 0.0,
            on_share: 1.0 / (1.0 + g.burstiness),
            period_end: 0.0,
            on: true,
        }
    }
}

impl Iterator for Generated<'_> {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        let g = self.g;
        while self.t < g.seconds {
            if g.burstiness > 0.0 && self.t >= self.period_end {
                self.on = self.random.unit() < self.on_share;
                self.period_end = self.t + 1.0 + 9.0 * self.random.unit();
            }
            let rate = if g.burstiness > 0.0 {
                if self.on {
                    g.rate * (1.0 + g.burstiness)
                } else {
                    0.0
                }
            } else {
                g.rate
            };
            if rate == 0.0 {
                self.t = self.period_end;
                continue;
            }
            self.t += -self.random.unit().ln() / rate;
            if g.burstiness > 0.0 && self.t >= self.period_end {
                // The on period ended before this arrival.
                self.t = self.period_end;
                continue;
            }
            if self.t >= g.seconds {
                break;
            }
            let pick = self.random.unit() * self.total;
            let client = self
                .cumulative
                .partition_point(|c| *c < pick)
                .min(self.names.len() - 1);
            return Some(Event {
                at: g.start * NANOS_PER_SEC + (self.t * NANOS_PER_SEC as f64) as Nanos,
                domain: self.domain.clone(),
                descriptors: smallvec::smallvec![smallvec::smallvec![(
                    self.key.clone(),
                    self.names[client].clone()
                )]],
                hits: 0,
            });
        }
        // Done: later calls end at once too.
        self.t = g.seconds;
        None
    }
}

/// Generated traffic, kept: at most `max_events` (the caller refuses a spec
/// that asks for more, see `--max-events`); memory is taken as events come,
/// not reserved for the whole run up front.
pub(crate) fn generate(g: &Generate, max_events: usize) -> Vec<Event> {
    let mut events = Vec::with_capacity((g.expected() as usize).min(max_events).min(1 << 20));
    events.extend(Generated::new(g).take(max_events));
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::traffic::{parse_line, to_jsonl};

    #[test]
    fn generated_traffic_has_its_rate_skew_and_seed() {
        let g: Generate = "rate=200,seconds=100,clients=50,zipf=1.2,seed=3"
            .parse()
            .expect("spec");
        let events = generate(&g, usize::MAX);
        let n = events.len() as f64;
        assert!(
            (n - 20_000.0).abs() < 600.0,
            "{n} events for 200/s over 100 s"
        );
        assert!(
            events.windows(2).all(|w| w[0].at <= w[1].at),
            "in time order"
        );
        let first = events
            .iter()
            .filter(|e| &*e.descriptors[0][0].1 == "c0")
            .count() as f64;
        let tenth = events
            .iter()
            .filter(|e| &*e.descriptors[0][0].1 == "c9")
            .count() as f64;
        // Zipf 1.2: client 1 sends 10^1.2 = 15.8 times as often as client 10.
        assert!((first / tenth - 15.8).abs() < 4.0, "{first} / {tenth}");
        assert_eq!(generate(&g, usize::MAX), events, "same seed, same traffic");
        let bursty = generate(
            &"rate=200,seconds=100,burstiness=3".parse().expect("spec"),
            usize::MAX,
        );
        let per_second = |s: u64| {
            bursty
                .iter()
                .filter(|e| e.at / NANOS_PER_SEC == g.start + s)
                .count()
        };
        let busiest = (0..100).map(per_second).max().unwrap_or(0);
        let idle = (0..100).filter(|s| per_second(*s) == 0).count();
        assert!(
            busiest > 600 && idle > 20,
            "bursts of ~800/s and idle seconds: {busiest}, {idle}"
        );
        assert!("rate=0".parse::<Generate>().is_err());
        // Hostile specs are refused with the reason, before anything runs.
        for bad in [
            "rate=1e308,seconds=1e-307",
            "clients=0",
            "clients=1.5",
            "start=1e11",
            "start=3999999999,seconds=10",
            "seconds=1e-12",
        ] {
            assert!(bad.parse::<Generate>().is_err(), "{bad}");
        }
        // At most the cap, whatever the spec says.
        let capped: Generate = "rate=1000,seconds=100".parse().expect("spec");
        assert_eq!(generate(&capped, 500).len(), 500);
        assert!("colour=red".parse::<Generate>().is_err());
        let mut text = Vec::new();
        to_jsonl(&events[..3], &mut text).expect("writes");
        let back: Vec<Event> = String::from_utf8(text)
            .expect("utf-8")
            .lines()
            .map(|l| parse_line(l).expect("reads back"))
            .collect();
        assert_eq!(back.len(), 3);
        assert_eq!(back[0].descriptors, events[0].descriptors);
    }
}
