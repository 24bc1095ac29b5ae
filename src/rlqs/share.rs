//! Fair shares of one bucket's global quota, and the token buckets Envoy
//! enforces for them. Pure: demand and time come in, assignments go out.
//!
//! Each Envoy (a client of the quota service) reports, per bucket, the
//! requests it allowed and denied over the last few seconds: its demand in
//! requests per second. A bucket's rate is its limit over its period (600
//! per minute: 10/s). A client's weight is its demand, at least a floor
//! (`min_share` of the rate) so that an idle client can start again at
//! once; a client that has not reported a full interval yet weighs as much
//! as the average client. Its share is the rate times its weight over the
//! sum of every client's weight (on every Tollgate instance): the shares
//! always add up to the rate, and a 3:1 demand gets a 3:1 share.

/// A rate of requests per second.
pub(crate) type PerSecond = f64;

/// What one Envoy is told to do with a bucket's requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Assignment {
    /// Admit every request.
    AllowAll,
    /// Refuse every request.
    DenyAll,
    /// Admit through a token bucket: `tokens_per_fill` tokens every
    /// `fill_seconds`, holding at most `max_tokens`.
    TokenBucket {
        /// The share this bucket was made for (requests per second).
        share: PerSecond,
        /// Tokens the bucket holds at most (its burst).
        max_tokens: u32,
        /// Tokens added per fill.
        tokens_per_fill: u32,
        /// Whole seconds between fills (Envoy 1.40 divides the tokens by the
        /// whole seconds of the interval, so fractions of a second are not
        /// used).
        fill_seconds: u32,
    },
}

/// How far a share may drift from the one Envoy has before it is told
/// again. Envoy replaces a token bucket (full again) whenever its settings
/// change, so re-sending on every small change would hand out fresh bursts.
pub(crate) const SHARE_TOLERANCE: f64 = 0.1;

/// The longest fill interval: a share below one request per hour is one
/// request per hour.
const MAX_FILL_SECONDS: u32 = 3600;

/// The floors of the pooled clients (idle ones, ones without a measured
/// demand yet, and named ones whose stream ended) together weigh at most this
/// share of the rate: a crowd of streams that ask for nothing (8,000 of them
/// in the attack this bounds) cannot outweigh one client that asks.
pub(crate) const POOL_SHARE: f64 = 0.25;

/// What one client claims of a bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Claim {
    /// Its demand (requests per second), once a report covered time.
    pub demand: Option<PerSecond>,
    /// Whether its stream is open (a named client's demand outlives its
    /// stream for a while, pooled).
    pub live: bool,
}

/// How a bucket's rate is divided among the clients of this instance (and
/// the other instances' weight), computed once from every claim; a client's
/// share then follows from its own claim alone (see [`Split::share`]).
///
/// - A demand counts up to the rate: no client can use more than the whole
///   bucket, so a report of `u64::MAX` requests weighs as much as one that
///   asked for the rate.
/// - A live client whose demand is above the floor (`min_share` of the rate)
///   is *active* and weighs its demand. The others are *pooled*: an idle one
///   weighs the floor, one without a demand yet the average demand, a
///   departed named one its last demand; together they weigh at most
///   [`POOL_SHARE`] of the rate (scaled down alike past it).
/// - Shares are proportional to weights (a 3:1 demand gets a 3:1 share),
///   with this instance's part of the rate going to its clients, and every
///   active client gets at least `min(floor, its part / active clients)`:
///   a real share of the rate, whatever the others claim. The shares add up
///   to the rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Split {
    rate: PerSecond,
    floor: PerSecond,
    /// The weight of a client without a demand yet (before pooling).
    unknown: f64,
    /// The factor every pooled weight is scaled by.
    pool_factor: f64,
    /// Share per unit of weight.
    scale: f64,
    /// The least share of an active client.
    minimum: PerSecond,
    /// The weight of this instance's clients, as it reports it to the others.
    local: f64,
    /// The weights of the active clients, and the pooled ones before the
    /// pool is scaled (for a newcomer's share).
    active_sum: f64,
    pooled_sum: f64,
    /// The other instances' weight.
    others: f64,
    /// Whether anyone weighs anything (else a client gets the whole rate).
    weighed: bool,
}

impl Split {
    /// The split of `rate` among `claims` (this instance's clients) and the
    /// other instances' weight `others`, with a floor of `min_share` of the
    /// rate.
    pub(crate) fn new(rate: PerSecond, claims: &[Claim], others: f64, min_share: f64) -> Self {
        let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
        let floor = min_share.clamp(0.0, 1.0) * rate;
        let known: Vec<f64> = claims
            .iter()
            .filter_map(|c| c.demand)
            .map(|d| clamp_demand(d, rate))
            .collect();
        let unknown = if known.is_empty() {
            rate
        } else {
            known.iter().sum::<f64>() / known.len() as f64
        }
        .max(floor);
        let mut split = Split {
            rate,
            floor,
            unknown,
            pool_factor: 1.0,
            scale: 0.0,
            minimum: 0.0,
            local: 0.0,
            active_sum: 0.0,
            pooled_sum: 0.0,
            others: 0.0,
            weighed: false,
        };
        let mut active: Vec<f64> = Vec::new();
        let mut pooled = 0.0;
        for claim in claims {
            match split.active_demand(claim) {
                Some(d) => active.push(d),
                None => pooled += split.nominal(claim),
            }
        }
        let cap = POOL_SHARE * rate;
        if pooled > cap && pooled > 0.0 {
            split.pool_factor = cap / pooled;
        }
        split.active_sum = active.iter().sum::<f64>();
        split.pooled_sum = pooled;
        let local = split.active_sum + pooled * split.pool_factor;
        let others = if others.is_finite() {
            others.max(0.0)
        } else {
            0.0
        };
        let total = local + others;
        split.local = local;
        split.others = others;
        if total <= 0.0 || local <= 0.0 {
            split.weighed = total > 0.0;
            return split;
        }
        split.weighed = true;
        let local_rate = rate * local / total;
        if !active.is_empty() {
            split.minimum = floor.min(local_rate / active.len() as f64);
        }
        // Raise the smallest active shares to the minimum, taking it from
        // the rest in proportion: the scale only falls, so one pass over the
        // sorted demands settles it.
        active.sort_by(f64::total_cmp);
        let mut scale = local_rate / local;
        let (mut raised, mut raised_weight) = (0usize, 0.0);
        while raised < active.len() && active[raised] * scale < split.minimum {
            raised_weight += active[raised];
            raised += 1;
            let rest = local - raised_weight;
            scale = if rest > 0.0 {
                ((local_rate - raised as f64 * split.minimum) / rest).max(0.0)
            } else {
                0.0
            };
        }
        split.scale = scale;
        split
    }

    /// The demand an active claim weighs; `None` for a pooled one.
    fn active_demand(&self, claim: &Claim) -> Option<f64> {
        let d = clamp_demand(claim.demand?, self.rate);
        (claim.live && d > self.floor).then_some(d)
    }

    /// A pooled claim's weight before the pool is scaled.
    fn nominal(&self, claim: &Claim) -> f64 {
        claim
            .demand
            .map_or(self.unknown, |d| clamp_demand(d, self.rate))
            .max(self.floor)
    }

    /// The share of a client claiming `claim` (one of the claims the split
    /// was made from, or a newcomer since, weighed alike).
    pub(crate) fn share(&self, claim: Claim) -> PerSecond {
        if !self.weighed {
            return self.rate;
        }
        let share = match self.active_demand(&claim) {
            Some(d) => (d * self.scale).max(self.minimum),
            None => self.nominal(&claim) * self.pool_factor * self.scale,
        };
        share.clamp(0.0, self.rate)
    }

    /// The share of a client that joined since the split was made, as if
    /// the split had been made with it: its weight is added to the active
    /// or the pooled ones (the raised minimum aside). Exact for the usual
    /// newcomer, a pooled one without a demand yet; a joining stream costs
    /// O(1), not a new split over every client.
    pub(crate) fn share_of_newcomer(&self, claim: Claim) -> PerSecond {
        let (active_sum, pooled_sum) = match self.active_demand(&claim) {
            Some(d) => (self.active_sum + d, self.pooled_sum),
            None => (self.active_sum, self.pooled_sum + self.nominal(&claim)),
        };
        let cap = POOL_SHARE * self.rate;
        let pool_factor = if pooled_sum > cap && pooled_sum > 0.0 {
            cap / pooled_sum
        } else {
            1.0
        };
        let local = active_sum + pooled_sum * pool_factor;
        let total = local + self.others;
        if total <= 0.0 {
            return self.rate;
        }
        let scale = self.rate / total;
        let share = match self.active_demand(&claim) {
            Some(d) => d * scale,
            None => self.nominal(&claim) * pool_factor * scale,
        };
        share.clamp(0.0, self.rate)
    }

    /// The weight of a client claiming `claim`, as shown to operators.
    pub(crate) fn weight(&self, claim: Claim) -> f64 {
        match self.active_demand(&claim) {
            Some(d) => d,
            None => self.nominal(&claim) * self.pool_factor,
        }
    }

    /// The weight of this instance's clients together.
    pub(crate) fn local_weight(&self) -> f64 {
        self.local
    }
}

/// A demand as it counts: at most the whole rate, never negative or NaN.
fn clamp_demand(demand: PerSecond, rate: PerSecond) -> f64 {
    if demand.is_nan() {
        return 0.0;
    }
    demand.clamp(0.0, rate)
}

/// The token bucket that enforces `share` requests per second for a limit
/// of `limit` requests per `period_seconds`: the fill interval (1 to 10
/// seconds) whose whole tokens come closest to the share (within 2 %,
/// preferring short intervals), and a bucket that holds the share of one
/// period (at least one fill, at most the whole limit).
pub(crate) fn token_bucket(share: PerSecond, limit: u64, period_seconds: u64) -> Assignment {
    if limit == 0 || share <= 0.0 || !share.is_finite() {
        return Assignment::DenyAll;
    }
    let (tokens_per_fill, fill_seconds) = if share * 10.0 < 1.0 {
        // Less than one request in ten seconds: one token per interval.
        let seconds = (1.0 / share)
            .round()
            .clamp(1.0, f64::from(MAX_FILL_SECONDS)) as u32;
        (1, seconds)
    } else {
        let mut best = (share.round().max(1.0) as u32, 1, f64::INFINITY);
        for seconds in 1..=10u32 {
            let tokens = (share * f64::from(seconds)).round().max(1.0);
            let error = (tokens / f64::from(seconds) - share).abs() / share;
            if error < best.2 - 1e-12 {
                best = (tokens.min(f64::from(u32::MAX)) as u32, seconds, error);
            }
            if error <= 0.02 {
                break;
            }
        }
        (best.0, best.1)
    };
    let per_period = (share * period_seconds as f64).round();
    let max_tokens = per_period
        .min(limit as f64)
        .min(f64::from(u32::MAX))
        .max(f64::from(tokens_per_fill)) as u32;
    Assignment::TokenBucket {
        share,
        max_tokens,
        tokens_per_fill,
        fill_seconds,
    }
}

/// What to tell a stream that holds `sent` (none yet: `None`) when its
/// assignment is now `fresh`: `None` when it should keep what it has (see
/// [`changed`]), else the assignment to send (see [`distinct_for_envoy`]).
pub(crate) fn to_send(sent: Option<&Assignment>, fresh: Assignment) -> Option<Assignment> {
    if sent.is_some_and(|s| !changed(s, &fresh)) {
        return None;
    }
    Some(distinct_for_envoy(sent, fresh))
}

/// Whether Envoy, holding `sent`, should be told `new` instead: a different
/// kind of assignment, or a share that moved by more than
/// [`SHARE_TOLERANCE`].
fn changed(sent: &Assignment, new: &Assignment) -> bool {
    match (sent, new) {
        (
            Assignment::TokenBucket { share: old, .. },
            Assignment::TokenBucket { share: new, .. },
        ) => (new - old).abs() > SHARE_TOLERANCE * old.max(f64::MIN_POSITIVE),
        (a, b) => a != b,
    }
}

/// `new` as it must be sent to a stream that holds `sent`. Envoy 1.40
/// compares token buckets by their tokens and the nanoseconds of their fill
/// interval only, so a bucket that differs from the one it holds in whole
/// seconds alone would be kept at the old rate: one more token of burst
/// makes it new.
fn distinct_for_envoy(sent: Option<&Assignment>, new: Assignment) -> Assignment {
    match (sent, new) {
        (
            Some(Assignment::TokenBucket {
                max_tokens: old_max,
                tokens_per_fill: old_tokens,
                fill_seconds: old_seconds,
                ..
            }),
            Assignment::TokenBucket {
                share,
                max_tokens,
                tokens_per_fill,
                fill_seconds,
            },
        ) if *old_max == max_tokens
            && *old_tokens == tokens_per_fill
            && *old_seconds != fill_seconds =>
        {
            Assignment::TokenBucket {
                share,
                max_tokens: max_tokens.saturating_add(1),
                tokens_per_fill,
                fill_seconds,
            }
        }
        (_, new) => new,
    }
}

#[cfg(test)]
mod tests;
