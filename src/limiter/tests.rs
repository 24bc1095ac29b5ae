use std::time::Duration;

use super::*;
use crate::clock::{ManualClock, NANOS_PER_SEC};
use crate::rules::RuleSet;
use crate::rules::Unit;
use crate::store::MemoryStoreOptions;

const RULES: &str = "domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-user}
  - key: org
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: watch
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 100, name: gold, replaces: [{name: per-user}]}
  - key: vault
    rate_limit: {unit: minute, requests_per_unit: 1, failure_mode: deny}
  - key: key
    rate_limits:
      - {name: per-second, unit: second, requests_per_unit: 1, algorithm: fixed_window}
      - {name: per-hour, unit: hour, requests_per_unit: 2, algorithm: fixed_window, failure_mode: deny}
      - {name: watched, unit: day, requests_per_unit: 1000, algorithm: fixed_window}
  - key: metered
    detailed_metric: true
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 100}
";

fn limiter_with(store: MemoryStoreOptions) -> (Limiter, ManualClock) {
    let rules = RuleSet::from_yaml(RULES).expect("rules load");
    let clock = ManualClock::new(1_000 * 60 * NANOS_PER_SEC);
    let limiter = Limiter::new(
        rules,
        Store::memory(store),
        Arc::new(clock.clone()),
        LimiterOptions::default(),
    );
    (limiter, clock)
}

fn limiter() -> (Limiter, ManualClock) {
    limiter_with(MemoryStoreOptions::default())
}

/// A request in domain `api` of plain descriptors (the answer tests' too).
pub(super) fn req<'a>(descriptors: &[&[(&'a str, &'a str)]]) -> Request<'a> {
    Request {
        domain: "api",
        descriptors: descriptors
            .iter()
            .map(|entries| Descriptor {
                entries: entries.iter().copied().collect(),
                ..Descriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn decide(l: &Limiter, r: &Request<'_>) -> Decision {
    l.should_rate_limit(r).await.expect("valid request")
}

#[tokio::test]
async fn blocked_requests_spend_nothing_from_the_other_descriptors() {
    let (l, _) = limiter();
    let both = req(&[&[("org", "acme")], &[("user", "ann")]]);
    for _ in 0..2 {
        assert!(!decide(&l, &both).await.over_limit);
    }
    for _ in 0..10 {
        let d = decide(&l, &both).await;
        assert!(d.over_limit);
        assert_eq!(
            (d.statuses[0].over_limit, d.statuses[1].over_limit),
            (false, true)
        );
        assert_eq!(d.statuses[0].remaining, 3, "the org budget is untouched");
    }
    // Another user of the same org still has the org's remaining 3.
    let other = req(&[&[("org", "acme")], &[("user", "bob")]]);
    assert!(!decide(&l, &other).await.over_limit);
    assert_eq!(
        decide(&l, &req(&[&[("org", "acme")]])).await.statuses[0].remaining,
        1
    );
}

#[tokio::test]
async fn shadow_mode_reports_but_never_blocks() {
    let (l, _) = limiter();
    let r = req(&[&[("watch", "x")]]);
    for _ in 0..5 {
        let d = decide(&l, &r).await;
        assert!(!d.over_limit && !d.statuses[0].over_limit);
        assert!(d.statuses[0].limit.as_ref().is_some_and(|l| l.shadow));
    }
}

#[tokio::test]
async fn unlimited_and_unmatched_descriptors_have_no_limit() {
    let (l, _) = limiter();
    let d = decide(&l, &req(&[&[("free", "x")], &[("nothing", "y")]])).await;
    assert!(!d.over_limit);
    assert!(d.statuses.iter().all(|s| s.limit.is_none()));
    assert!(d.headers.is_empty());
    let unknown = Request {
        domain: "elsewhere",
        ..req(&[&[("user", "x")]])
    };
    assert!(decide(&l, &unknown).await.statuses[0].limit.is_none());
}

#[tokio::test]
async fn replaces_drops_the_named_limit() {
    let (l, _) = limiter();
    let r = req(&[&[("plan", "gold")], &[("user", "ann")]]);
    for _ in 0..5 {
        let d = decide(&l, &r).await;
        assert!(!d.over_limit);
        assert!(
            d.statuses[1].limit.is_none(),
            "per-user is replaced by gold"
        );
        assert_eq!(d.statuses[0].limit.as_ref().map(|l| &*l.name), Some("gold"));
    }
}

#[tokio::test]
async fn hits_addend_request_and_descriptor_level() {
    let (l, _) = limiter();
    let mut r = req(&[&[("org", "a")]]);
    r.hits_addend = 3;
    assert_eq!(decide(&l, &r).await.statuses[0].remaining, 2);
    r.descriptors[0].hits_addend = Some(0);
    let check = decide(&l, &r).await;
    assert_eq!(
        check.statuses[0].remaining, 2,
        "0 on a descriptor checks without counting"
    );
    r.descriptors[0].hits_addend = Some(3);
    assert!(decide(&l, &r).await.over_limit, "3 more than the 2 left");
    r.descriptors[0].hits_addend = Some(2);
    assert!(!decide(&l, &r).await.over_limit);
}

#[tokio::test]
async fn limit_override_replaces_the_configured_limit() {
    let (l, _) = limiter();
    let mut r = req(&[&[("org", "b")]]);
    r.descriptors[0].limit_override = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour,
    });
    let first = decide(&l, &r).await;
    let applied = first.statuses[0].limit.clone().expect("override applies");
    assert_eq!((applied.requests_per_unit, applied.unit), (1, Unit::Hour));
    assert!(decide(&l, &r).await.over_limit);
}

#[tokio::test]
async fn headers_follow_the_draft_and_retry_after_rounds_up() {
    let (l, clock) = limiter();
    clock.advance(Duration::from_millis(12_300)); // 47.7 s left in the minute
    let r = req(&[&[("user", "ann")], &[("org", "acme")]]);
    let ok = decide(&l, &r).await;
    assert_eq!(
        ok.headers,
        vec![
            (
                "ratelimit-policy",
                "\"per-user\";q=2;w=60, \"api.org\";q=5;w=60".to_owned()
            ),
            (
                "ratelimit",
                "\"per-user\";r=1;t=48, \"api.org\";r=4;t=48".to_owned()
            ),
        ]
    );
    decide(&l, &r).await;
    let refused = decide(&l, &r).await;
    assert!(refused.over_limit);
    let retry = refused
        .headers
        .iter()
        .find(|h| h.0 == "retry-after")
        .expect("retry-after");
    // Sliding window: 2 hits this window, none before; the next window starts in 47.7 s
    // and from then the previous 2 fade.
    let wait = refused.statuses[0].reset;
    assert_eq!(retry.1, wait.div_ceil(NANOS_PER_SEC).to_string());
    assert!(wait > 47 * NANOS_PER_SEC);
}

#[tokio::test]
async fn store_failure_gets_each_rules_failure_mode() {
    // A store that can hold nothing: every new key fails.
    let (l, _) = limiter_with(MemoryStoreOptions {
        max_keys: 0,
        shards: 1,
    });
    let d = decide(&l, &req(&[&[("org", "x")]])).await;
    assert!(!d.over_limit, "server default: allow");
    let d = decide(&l, &req(&[&[("vault", "x")]])).await;
    assert!(d.over_limit, "the rule says deny");
    assert!(d.headers.iter().any(|h| h.0 == "retry-after" && h.1 == "1"));
}

#[tokio::test]
async fn malformed_requests_name_the_problem() {
    let (l, _) = limiter();
    let cases = [
        (
            Request {
                domain: "",
                ..req(&[&[("user", "x")]])
            },
            "domain",
        ),
        (req(&[]), "no descriptors"),
        (
            req(&[&[("user", "x")], &[("", "y")]]),
            "descriptor 1 entry 0 has an empty key",
        ),
    ];
    for (r, needle) in cases {
        match l.should_rate_limit(&r).await {
            Err(LimitError::InvalidArgument(m)) => assert!(m.contains(needle), "{m}"),
            other => panic!("expected invalid argument for {needle}: {other:?}"),
        }
    }
}

/// Envoy sends a descriptor without entries when every action of a
/// rate_limits entry was skipped (`skip_if_absent`): it matches nothing and
/// the request's other descriptors are decided (an error would fail the
/// whole request open).
#[tokio::test]
async fn a_descriptor_without_entries_is_unlimited_and_the_others_are_decided() {
    let (l, _) = limiter();
    let user: &[(&str, &str)] = &[("user", "empty")];
    for expected in [false, false, true] {
        let d = l
            .should_rate_limit(&req(&[&[], user]))
            .await
            .expect("decided");
        assert_eq!(d.over_limit, expected);
        assert_eq!(d.statuses.len(), 2);
        assert!(!d.statuses[0].over_limit, "the empty one is OK");
    }
}

#[tokio::test]
async fn several_limits_headers_list_all_and_retry_after_waits_for_every_refusal() {
    let (limiter, clock) = limiter();
    let key: &[(&str, &str)] = &[("key", "k")];
    let first = limiter.should_rate_limit(&req(&[key])).await.expect("ok");
    let policy = &first
        .headers
        .iter()
        .find(|h| h.0 == "ratelimit-policy")
        .expect("policy")
        .1;
    assert_eq!(
        policy,
        "\"per-second\";q=1;w=1, \"per-hour\";q=2;w=3600, \"watched\";q=1000;w=86400"
    );
    // The second request in the same second: both the second and (after
    // the next one) the hour refuse; Retry-After is the longer wait.
    let refused = limiter.should_rate_limit(&req(&[key])).await.expect("ok");
    assert!(refused.over_limit);
    let status = &refused.statuses[0];
    assert_eq!(status.limit.as_ref().map(|l| &*l.name), Some("per-second"));
    clock.set(clock.now() + NANOS_PER_SEC);
    assert!(
        !limiter
            .should_rate_limit(&req(&[key]))
            .await
            .expect("ok")
            .over_limit
    );
    let both = limiter.should_rate_limit(&req(&[key])).await.expect("ok");
    assert!(both.over_limit);
    let retry = &both
        .headers
        .iter()
        .find(|h| h.0 == "retry-after")
        .expect("retry")
        .1;
    let hour_left: u64 = both.statuses[0]
        .others
        .iter()
        .chain(std::iter::once(&LimitStatus {
            over_limit: both.statuses[0].over_limit,
            limit: both.statuses[0].limit.clone().expect("limit"),
            remaining: both.statuses[0].remaining,
            reset: both.statuses[0].reset,
            tagged: false,
        }))
        .filter(|s| s.over_limit)
        .map(|s| s.reset.div_ceil(NANOS_PER_SEC))
        .max()
        .expect("refusals");
    assert!(
        hour_left > 1_000,
        "the hour's wait, not the second's: {hour_left}"
    );
    assert_eq!(retry, &hour_left.to_string());
    // The status names the limit Retry-After waits for, with its wait (it
    // named the first refusing limit in file order, the second's 1 s).
    let status = &both.statuses[0];
    assert_eq!(status.limit.as_ref().map(|l| &*l.name), Some("per-hour"));
    assert_eq!(status.reset.div_ceil(NANOS_PER_SEC), hour_left);
    // Metrics: one series per limit, told apart by its name.
    let metrics = limiter.metrics().render();
    for limit in ["per-second", "per-hour", "watched"] {
        let series = format!(
            "ratelimit_service_rate_limit_total_hits{{domain=\"api\",key1=\"key\",limit=\"{limit}\"}} 4"
        );
        assert!(metrics.contains(&series), "{series} in\n{metrics}");
    }
}

#[tokio::test]
async fn detailed_metrics_of_several_limits_stay_apart() {
    let (limiter, _clock) = limiter();
    limiter
        .should_rate_limit(&req(&[&[("metered", "m1")]]))
        .await
        .expect("ok");
    let metrics = limiter.metrics().render();
    for limit in ["second", "minute"] {
        let series = format!(
            "ratelimit_service_rate_limit_total_hits{{domain=\"api\",key1=\"metered_m1\",limit=\"{limit}\"}} 1"
        );
        assert!(metrics.contains(&series), "{series} in\n{metrics}");
    }
}

#[tokio::test]
async fn global_quota_mode_refuses_only_when_every_descriptor_is_over() {
    let (plain, _clock) = limiter();
    let rules = plain.rules();
    let clock = ManualClock::new(1_000 * 60 * NANOS_PER_SEC);
    let limiter = Limiter::new(
        (*rules).clone(),
        Store::memory(MemoryStoreOptions::default()),
        Arc::new(clock.clone()),
        LimiterOptions {
            quota_mode: true,
            ..LimiterOptions::default()
        },
    );
    // vault allows 1, user 2 a minute: every descriptor is a quota one.
    let both: &[&[(&str, &str)]] = &[&[("vault", "v")], &[("user", "u")]];
    assert!(
        !limiter
            .should_rate_limit(&req(both))
            .await
            .expect("ok")
            .over_limit
    );
    let second = limiter.should_rate_limit(&req(both)).await.expect("ok");
    assert!(!second.over_limit, "user still admits");
    assert!(second.statuses[0].over_limit && !second.statuses[1].over_limit);
    let third = limiter.should_rate_limit(&req(both)).await.expect("ok");
    assert!(third.over_limit, "both are over");
}

/// Counts the warnings logged while it is the thread's subscriber.
#[derive(Clone, Default)]
struct Warnings(Arc<std::sync::atomic::AtomicUsize>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if *event.metadata().level() == tracing::Level::WARN {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// A rule that flaps between two definitions (a reload every 250 ms, say)
/// restarts its counters each time, but is logged once a minute, not on
/// every reload.
#[test]
fn a_flapping_rule_logs_its_restart_once_a_minute() {
    use tracing_subscriber::layer::SubscriberExt;
    let a = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let b = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: fixed_window}\n";
    let clock = ManualClock::new(1_000 * 60 * NANOS_PER_SEC);
    let limiter = Limiter::in_memory(RuleSet::from_yaml(a).expect("a"), Arc::new(clock.clone()));
    let warnings = Warnings::default();
    let subscriber = tracing_subscriber::registry().with(warnings.clone());
    tracing::subscriber::with_default(subscriber, || {
        for i in 0..40 {
            let next = if i % 2 == 0 { b } else { a };
            limiter.set_rules(RuleSet::from_yaml(next).expect("rules"));
            clock.advance(Duration::from_millis(250));
        }
        assert_eq!(
            warnings.0.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "10 s of flapping"
        );
        clock.advance(Duration::from_secs(60));
        limiter.set_rules(RuleSet::from_yaml(b).expect("b"));
    });
    assert_eq!(
        warnings.0.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "logged again a minute later"
    );
}

/// A rule set replaced by a reload (or an xDS push) is freed once the
/// requests planned from it are done: nothing in the limiter keeps it.
#[tokio::test]
async fn a_replaced_rule_set_is_released() {
    let (l, _) = limiter();
    let old = std::sync::Arc::downgrade(&l.rules());
    let request = req(&[&[("ip", "1.2.3.4")]]);
    decide(&l, &request).await;
    l.set_rules(
        RuleSet::from_yaml(
            "domain: api\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 9}\n",
        )
        .expect("loads"),
    );
    assert!(old.upgrade().is_none(), "the old rule set is still held");
    decide(&l, &request).await;
}
