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

fn live(demand: f64) -> Claim {
    Claim {
        demand: Some(demand),
        live: true,
    }
}

fn shares(split: &Split, claims: &[Claim]) -> Vec<f64> {
    claims
        .iter()
        .map(|c| (split.share(*c) * 1000.0).round() / 1000.0)
        .collect()
}

#[test]
fn shares_follow_demand_and_add_up_to_the_rate() {
    let claims = [live(15.0), live(5.0)];
    let split = Split::new(20.0, &claims, 0.0, 0.05);
    assert_eq!(shares(&split, &claims), vec![15.0, 5.0]);
    // An idle client keeps a share, so it can start again at once, and
    // the shares still add up to the rate.
    let claims = [live(15.0), live(5.0), live(0.0)];
    let split = Split::new(20.0, &claims, 0.0, 0.05);
    let all = shares(&split, &claims);
    assert!(all[2] > 0.0, "{all:?}");
    assert!((all.iter().sum::<f64>() - 20.0).abs() < 0.01, "{all:?}");
    // A client without a report yet counts as the average.
    let newcomer = Claim {
        demand: None,
        live: true,
    };
    let split = Split::new(20.0, &[live(10.0), live(10.0), newcomer], 0.0, 0.05);
    assert_eq!(
        split.weight(newcomer),
        5.0,
        "the average, pooled to a quarter of the rate"
    );
    // Nothing known: the whole rate.
    let split = Split::new(20.0, &[], 0.0, 0.05);
    assert_eq!(split.share(newcomer), 20.0);
    // Another instance's weight takes its part.
    let split = Split::new(20.0, &[live(10.0)], 10.0, 0.05);
    assert_eq!(split.share(live(10.0)), 10.0);
}

#[test]
fn a_claim_above_the_rate_counts_as_the_rate() {
    // Two honest clients at 10/s and one that reports u64::MAX requests.
    let claims = [live(10.0), live(10.0), live(u64::MAX as f64)];
    let split = Split::new(20.0, &claims, 0.0, 0.05);
    assert_eq!(shares(&split, &claims), vec![5.0, 5.0, 10.0]);
    for poison in [f64::INFINITY, f64::NAN, -1.0] {
        let claims = [live(10.0), live(poison)];
        let split = Split::new(20.0, &claims, 0.0, 0.05);
        let all = shares(&split, &claims);
        // At worst, the honest client's part against a claim of the
        // whole rate: 10 of 30.
        assert!(all[0] >= 6.66, "{poison}: {all:?}");
        assert!(all.iter().sum::<f64>() <= 20.001, "{poison}: {all:?}");
    }
}

#[test]
fn a_crowd_of_idle_or_new_streams_cannot_outweigh_one_that_asks() {
    for crowd in [
        Claim {
            demand: Some(0.0),
            live: true,
        },
        Claim {
            demand: None,
            live: true,
        },
        Claim {
            demand: Some(20.0),
            live: false,
        },
    ] {
        let mut claims = vec![crowd; 8_000];
        claims.push(live(10.0));
        let split = Split::new(20.0, &claims, 0.0, 0.05);
        let honest = split.share(live(10.0));
        assert!(honest >= 10.0, "{crowd:?}: the honest client gets {honest}");
        let sum = 8_000.0 * split.share(crowd) + honest;
        assert!(sum <= 20.0 + 1e-9, "{crowd:?}: the shares add up to {sum}");
    }
}

#[test]
fn every_active_client_keeps_a_minimum_share_of_the_rate() {
    // 100 clients claiming the whole rate and one asking for 10/s: each
    // gets at least the rate over the clients (not 10/2010 of it).
    let mut claims = vec![live(20.0); 100];
    claims.push(live(10.0));
    let split = Split::new(20.0, &claims, 0.0, 0.05);
    let honest = split.share(live(10.0));
    assert!(honest >= 20.0 / 101.0 - 1e-9, "{honest}");
    let sum: f64 = claims.iter().map(|c| split.share(*c)).sum();
    assert!((sum - 20.0).abs() < 1e-6, "{sum}");
    // With few clients the minimum is the floor (5 % of the rate).
    let claims = [live(20.0), live(20.0), live(1.5)];
    let split = Split::new(20.0, &claims, 0.0, 0.05);
    let all = shares(&split, &claims);
    assert!(all[2] >= 1.0, "{all:?}");
    assert!((all.iter().sum::<f64>() - 20.0).abs() < 0.01, "{all:?}");
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
