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
pub type PerSecond = f64;

/// What one Envoy is told to do with a bucket's requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Assignment {
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
pub const SHARE_TOLERANCE: f64 = 0.1;

/// The longest fill interval: a share below one request per hour is one
/// request per hour.
const MAX_FILL_SECONDS: u32 = 3600;

/// A client's weight in the division: its demand, at least `floor`; a client
/// without a measured demand yet counts as `unknown`.
pub fn weight(demand: Option<PerSecond>, floor: PerSecond, unknown: PerSecond) -> f64 {
    demand.unwrap_or(unknown).max(floor)
}

/// A client's share of `rate`: `rate * weight / total`. `total` includes the
/// client's own weight; a total that is not positive gives the whole rate.
pub fn share(rate: PerSecond, weight: f64, total: f64) -> PerSecond {
    if total <= 0.0 || !total.is_finite() {
        return rate;
    }
    (rate * weight / total).clamp(0.0, rate)
}

/// The token bucket that enforces `share` requests per second for a limit
/// of `limit` requests per `period_seconds`: the fill interval (1 to 10
/// seconds) whose whole tokens come closest to the share (within 2 %,
/// preferring short intervals), and a bucket that holds the share of one
/// period (at least one fill, at most the whole limit).
pub fn token_bucket(share: PerSecond, limit: u64, period_seconds: u64) -> Assignment {
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
pub fn to_send(sent: Option<&Assignment>, fresh: Assignment) -> Option<Assignment> {
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
mod tests {
    use super::*;

    fn rate_of(a: Assignment) -> f64 {
        match a {
            Assignment::TokenBucket {
                tokens_per_fill,
                fill_seconds,
                ..
            } => f64::from(tokens_per_fill) / f64::from(fill_seconds),
            other => panic!("not a token bucket: {other:?}"),
        }
    }

    #[test]
    fn shares_follow_demand_and_add_up_to_the_rate() {
        let rate = 20.0;
        let floor = 0.05 * rate;
        let weights = [
            weight(Some(30.0), floor, 0.0),
            weight(Some(10.0), floor, 0.0),
        ];
        let total: f64 = weights.iter().sum();
        let shares: Vec<f64> = weights.iter().map(|w| share(rate, *w, total)).collect();
        assert_eq!(shares, vec![15.0, 5.0]);
        // An idle client keeps the floor, so it can start again at once.
        let idle = weight(Some(0.0), floor, 0.0);
        assert_eq!(idle, 1.0);
        let total = weights.iter().sum::<f64>() + idle;
        let sum: f64 = [weights[0], weights[1], idle]
            .iter()
            .map(|w| share(rate, *w, total))
            .sum();
        assert!((sum - rate).abs() < 1e-9, "{sum}");
        // A client without a report yet counts as the average.
        assert_eq!(weight(None, floor, 20.0), 20.0);
        // Nothing known: the whole rate.
        assert_eq!(share(rate, 1.0, 0.0), rate);
        assert_eq!(share(rate, 1.0, f64::NAN), rate);
    }

    #[test]
    fn token_buckets_come_close_to_the_share_in_whole_seconds() {
        for share in [
            0.001, 0.05, 0.1, 0.3, 0.5, 1.0, 1.5, 2.5, 3.3, 7.25, 15.0, 123.4, 1e6,
        ] {
            let a = token_bucket(share, 1_000_000_000, 1);
            let got = rate_of(a);
            let Assignment::TokenBucket {
                fill_seconds,
                max_tokens,
                tokens_per_fill,
                ..
            } = a
            else {
                unreachable!()
            };
            assert!(
                (1..=MAX_FILL_SECONDS).contains(&fill_seconds),
                "{share}: {a:?}"
            );
            assert!(
                max_tokens >= tokens_per_fill && tokens_per_fill >= 1,
                "{share}: {a:?}"
            );
            if share >= 0.1 {
                assert!(
                    (got - share).abs() / share <= 0.05,
                    "{share}: {got} ({a:?})"
                );
            } else {
                // One token per interval: the interval rounds 1/share.
                assert!((got - share).abs() / share <= 0.5, "{share}: {got} ({a:?})");
            }
        }
        assert_eq!(
            token_bucket(15.0, 20, 1),
            Assignment::TokenBucket {
                share: 15.0,
                max_tokens: 15,
                tokens_per_fill: 15,
                fill_seconds: 1
            }
        );
        // A share of a per-minute limit holds its share of the minute.
        assert_eq!(
            token_bucket(2.5, 600, 60),
            Assignment::TokenBucket {
                share: 2.5,
                max_tokens: 150,
                tokens_per_fill: 5,
                fill_seconds: 2
            }
        );
        assert_eq!(token_bucket(1.0, 0, 60), Assignment::DenyAll);
        assert_eq!(token_bucket(0.0, 10, 60), Assignment::DenyAll);
        assert_eq!(token_bucket(f64::INFINITY, 10, 60), Assignment::DenyAll);
    }

    #[test]
    fn small_moves_keep_the_bucket_envoy_has() {
        let a = token_bucket(10.0, 100, 1);
        assert!(!changed(&a, &token_bucket(10.9, 100, 1)));
        assert!(changed(&a, &token_bucket(11.5, 100, 1)));
        assert!(changed(&a, &Assignment::DenyAll));
        assert!(!changed(&Assignment::DenyAll, &Assignment::DenyAll));
        assert!(changed(&Assignment::AllowAll, &Assignment::DenyAll));
        assert_eq!(to_send(None, a), Some(a), "a stream without one gets one");
        assert_eq!(to_send(Some(&a), token_bucket(10.9, 100, 1)), None);
        assert_eq!(
            to_send(Some(&a), Assignment::DenyAll),
            Some(Assignment::DenyAll)
        );
    }

    #[test]
    fn a_bucket_that_differs_in_whole_seconds_only_is_made_distinct() {
        let old = token_bucket(0.5, 100, 1);
        let new = token_bucket(0.25, 100, 1);
        // Both: one token, one token at most; two and four seconds.
        let sent = distinct_for_envoy(Some(&old), new);
        let (
            Assignment::TokenBucket { max_tokens: a, .. },
            Assignment::TokenBucket { max_tokens: b, .. },
        ) = (old, sent)
        else {
            unreachable!()
        };
        assert_eq!((a, b), (1, 2));
        assert_eq!(distinct_for_envoy(None, new), new);
        assert_eq!(distinct_for_envoy(Some(&new), new), new);
    }
}
