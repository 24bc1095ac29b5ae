use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;

use super::*;
use crate::clock::{ManualClock, NANOS_PER_SEC};
use crate::limiter::Limiter;
use crate::rules::RuleSet;

pub(super) const RULES: &str = "domain: rlqs
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: plan
    value: daily
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: open
    rate_limit: {unlimited: true}
  - key: closed
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: watched
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
";

pub(super) fn rules(text: &str) -> RuleSet {
    RuleSet::from_yaml(text).expect("rules load")
}

/// Quotas on a memory store at the start of a minute.
pub(super) fn quotas(options: QuotaOptions) -> (Arc<Quotas>, Arc<Limiter>, ManualClock) {
    let clock = ManualClock::new(1_000 * 60 * NANOS_PER_SEC);
    let limiter = Arc::new(Limiter::in_memory(rules(RULES), Arc::new(clock.clone())));
    (
        Arc::new(Quotas::new(Handles::of(&limiter), options)),
        limiter,
        clock,
    )
}

pub(super) fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

pub(super) fn usage(
    entries: &[(&str, &str)],
    allowed: u64,
    denied: u64,
    seconds: i64,
) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(bucket(entries)),
        time_elapsed: Some(PbDuration { seconds, nanos: 0 }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

pub(super) fn report(usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "rlqs".into(),
        bucket_quota_usages: usages,
    }
}

/// Each bucket's assignment in a response, by its entries.
pub(super) fn actions(answer: &answer::Answer) -> HashMap<String, String> {
    answer
        .clone()
        .into_wire()
        .bucket_action
        .iter()
        .map(|a| {
            let mut id: Vec<_> = a
                .bucket_id
                .as_ref()
                .expect("present")
                .bucket
                .iter()
                .collect();
            id.sort();
            let id = id
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            let what = match a.bucket_action.as_ref().expect("present") {
                Action::AbandonAction(_) => "abandon".to_string(),
                Action::QuotaAssignmentAction(q) => {
                    assert!(q.assignment_time_to_live.as_ref().expect("present").seconds >= 1);
                    match q
                        .rate_limit_strategy
                        .as_ref()
                        .expect("present")
                        .strategy
                        .expect("present")
                    {
                        Strategy::BlanketRule(r) if r == BlanketRule::AllowAll as i32 => {
                            "allow".into()
                        }
                        Strategy::BlanketRule(_) => "deny".into(),
                        Strategy::TokenBucket(t) => format!(
                            "{}/{}s max {}",
                            t.tokens_per_fill.expect("present").value,
                            t.fill_interval.expect("present").seconds,
                            t.max_tokens
                        ),
                        Strategy::RequestsPerTimeUnit(_) => "per time unit".into(),
                    }
                }
            };
            (id, what)
        })
        .collect()
}

pub(super) fn one(response: &answer::Answer) -> String {
    let all = actions(response);
    assert_eq!(all.len(), 1, "{all:?}");
    all.into_values().next().expect("present")
}

pub(super) fn tick(quotas: &Quotas) {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("present")
        .block_on(quotas.tick(quotas.now()));
}

/// What was pushed to a stream since last asked, merged.
pub(super) fn pushed(rx: &mut Inbox) -> HashMap<String, String> {
    let mut all = HashMap::new();
    while let Some(message) = rx.try_recv() {
        all.extend(actions(&message));
    }
    all
}

#[test]
fn the_rate_is_divided_by_demand_and_rebalanced_as_reports_arrive() {
    let (q, _, clock) = quotas(QuotaOptions::default());
    let key = [("api_key", "k1")];
    let (a, mut rx_a) = q.open(Some("gateway-a")).expect("opens");
    // Envoy's first report for a new bucket covers no time: alone, the
    // whole rate.
    let r = q
        .answer(a, &report(vec![usage(&key, 1, 0, 0)]))
        .expect("present");
    assert_eq!(one(&r), "20/1s max 20");
    let (b, mut rx_b) = q.open(Some("gateway-b")).expect("opens");
    // A second Envoy without a measured demand weighs as much as the
    // average one: half.
    let r = q
        .answer(b, &report(vec![usage(&key, 1, 0, 0)]))
        .expect("present");
    assert_eq!(one(&r), "10/1s max 10");
    tick(&q);
    assert_eq!(pushed(&mut rx_a)["api_key=k1"], "10/1s max 10");
    assert!(pushed(&mut rx_b).is_empty(), "nothing changed for b");
    // Five seconds later: a offered 15/s, b 5/s.
    clock.advance(Duration::from_secs(5));
    let r = q
        .answer(a, &report(vec![usage(&key, 50, 25, 5)]))
        .expect("present");
    // b has no rate yet: it weighs as much as the average client (15), but
    // pooled clients weigh at most a quarter of the rate (5): 15 of 20.
    assert_eq!(one(&r), "15/1s max 15");
    let r = q
        .answer(b, &report(vec![usage(&key, 25, 0, 5)]))
        .expect("present");
    assert_eq!(one(&r), "5/1s max 5", "5 of 20");
    tick(&q);
    assert!(pushed(&mut rx_a).is_empty(), "a already has 15 of 20");
    assert!(pushed(&mut rx_b).is_empty());
    // Small moves do not hand Envoy a new (full) bucket.
    clock.advance(Duration::from_secs(5));
    let r = q
        .answer(a, &report(vec![usage(&key, 75, 5, 5)]))
        .expect("present");
    assert_eq!(one(&r), "15/1s max 15", "16 of 21 is within 10 % of 15");
    // b goes quiet: once its last report is stale, a takes the whole rate
    // and b is forgotten.
    clock.advance(Duration::from_secs(6));
    let r = q
        .answer(a, &report(vec![usage(&key, 75, 0, 5)]))
        .expect("present");
    assert_eq!(one(&r), "15/1s max 15");
    clock.advance(Duration::from_secs(5));
    let r = q
        .answer(a, &report(vec![usage(&key, 75, 0, 5)]))
        .expect("present");
    assert_eq!(one(&r), "20/1s max 20");
    tick(&q);
    let json = q.to_json(10);
    assert_eq!(
        json["buckets"][0]["clients"]
            .as_array()
            .expect("present")
            .len(),
        1
    );
}

#[test]
fn an_idle_client_keeps_a_floor_and_a_named_client_keeps_its_share_across_reconnects() {
    let (q, _, clock) = quotas(QuotaOptions::default());
    let key = [("api_key", "k1")];
    let (a, _rx_a) = q.open(Some("a")).expect("opens");
    let (b, _rx_b) = q.open(Some("b")).expect("opens");
    q.answer(a, &report(vec![usage(&key, 1, 0, 0)]))
        .expect("present");
    q.answer(b, &report(vec![usage(&key, 1, 0, 0)]))
        .expect("present");
    clock.advance(Duration::from_secs(5));
    q.answer(a, &report(vec![usage(&key, 100, 0, 5)]))
        .expect("present");
    clock.advance(Duration::from_millis(10));
    // b sent nothing: its weight is the floor, 5 % of 20/s = 1 of 21.
    let r = q
        .answer(b, &report(vec![usage(&key, 0, 0, 5)]))
        .expect("present");
    assert_eq!(one(&r), "1/1s max 1");
    // b reconnects (a new stream, same name): its first report covers no
    // time, and it still has the share it had.
    q.close(b, q.now());
    let (b2, _rx) = q.open(Some("b")).expect("opens");
    // (Reports read a split at most 10 ms old.)
    clock.advance(Duration::from_millis(10));
    let r = q
        .answer(b2, &report(vec![usage(&key, 0, 0, 0)]))
        .expect("present");
    assert_eq!(one(&r), "1/1s max 1");
    // An anonymous stream's demand goes with it.
    let (c, _rx_c) = q.open(None).expect("opens");
    clock.advance(Duration::from_secs(1));
    q.answer(c, &report(vec![usage(&key, 0, 300, 5)]))
        .expect("present");
    let r = q
        .answer(a, &report(vec![usage(&key, 20, 0, 1)]))
        .expect("present");
    assert_eq!(
        one(&r),
        "29/3s max 29",
        "a 20, b 1, c 60 counted as the rate (20): 20 x 20/41"
    );
    q.close(c, q.now());
    clock.advance(Duration::from_millis(10));
    let r = q
        .answer(a, &report(vec![usage(&key, 20, 0, 1)]))
        .expect("present");
    assert_eq!(one(&r), "19/1s max 19", "a 20, b 1: 20 x 20/21");
}

#[test]
fn a_spent_window_is_denied_until_it_ends() {
    let (q, _, clock) = quotas(QuotaOptions::default());
    let key = [("plan", "daily")];
    let (a, mut rx) = q.open(Some("a")).expect("opens");
    let r = q
        .answer(a, &report(vec![usage(&key, 1, 0, 0)]))
        .expect("present");
    // 100 per minute: 5 per 3 seconds, holding the minute's 100.
    assert_eq!(one(&r), "5/3s max 100");
    clock.advance(Duration::from_secs(5));
    let r = q
        .answer(a, &report(vec![usage(&key, 99, 0, 5)]))
        .expect("present");
    assert_eq!(one(&r), "deny", "100 admitted in this minute");
    let json = q.to_json(10);
    assert_eq!(json["buckets"][0]["window_used"], 100);
    // Envoy reports every 5 s; the window stays spent.
    for _ in 0..10 {
        clock.advance(Duration::from_secs(5));
        let r = q
            .answer(a, &report(vec![usage(&key, 0, 10, 5)]))
            .expect("present");
        assert_eq!(one(&r), "deny");
    }
    // The next minute: a token bucket again, pushed without waiting for a report.
    clock.advance(Duration::from_secs(5));
    tick(&q);
    assert_eq!(pushed(&mut rx)["plan=daily"], "5/3s max 100");
}

#[test]
fn buckets_without_a_limit_and_special_limits() {
    let (q, _, _) = quotas(QuotaOptions::default());
    let (a, _rx) = q.open(None).expect("opens");
    let r = q
        .answer(
            a,
            &report(vec![
                usage(&[("nobody", "x")], 1, 0, 0),
                usage(&[("open", "x")], 1, 0, 0),
                usage(&[("closed", "x")], 1, 0, 0),
                usage(&[("watched", "x")], 1, 0, 0),
            ]),
        )
        .expect("present");
    let all = actions(&r);
    assert_eq!(all["nobody=x"], "allow", "no rule: the default");
    assert_eq!(all["open=x"], "allow", "unlimited");
    assert_eq!(all["closed=x"], "deny", "a limit of zero");
    assert_eq!(all["watched=x"], "allow", "shadow mode never refuses");
    let (q, _, _) = quotas(QuotaOptions {
        unmatched: Unmatched::Deny,
        ..QuotaOptions::default()
    });
    let (a, _rx) = q.open(None).expect("opens");
    let r = q
        .answer(a, &report(vec![usage(&[("nobody", "x")], 1, 0, 0)]))
        .expect("present");
    assert_eq!(one(&r), "deny");
}

#[test]
fn a_reload_abandons_removed_buckets_and_pushes_changed_limits() {
    let (q, limiter, _) = quotas(QuotaOptions::default());
    let (a, mut rx) = q.open(Some("a")).expect("opens");
    q.answer(
        a,
        &report(vec![
            usage(&[("api_key", "k1")], 1, 0, 0),
            usage(&[("plan", "daily")], 1, 0, 0),
        ]),
    )
    .expect("present");
    let old = Arc::downgrade(&limiter.rules());
    limiter.set_rules(rules(
        "domain: rlqs
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 8}
",
    ));
    tick(&q);
    // The quota service follows the reload at its tick and lets the
    // replaced rule set go.
    assert!(old.upgrade().is_none(), "the old rule set is still held");
    let pushed = pushed(&mut rx);
    assert_eq!(pushed["api_key=k1"], "8/1s max 8");
    assert_eq!(pushed["plan=daily"], "abandon");
    assert_eq!(q.to_json(10)["buckets_total"], 1);
}

/// The token bucket's rate in an action string such as "29/3s max 29".
pub(super) fn rate_of(action: &str) -> f64 {
    let (tokens, rest) = action.split_once('/').expect("a token bucket");
    let seconds = rest.split_once('s').expect("seconds").0;
    tokens.parse::<f64>().expect("tokens") / seconds.parse::<f64>().expect("seconds")
}

#[test]
fn streams_sharing_a_name_are_clients_of_their_own() {
    let (q, _, clock) = quotas(QuotaOptions::default());
    let key = [("api_key", "k1")];
    // Four gateways deployed from one config, all named gateway-a, each
    // offering 15/s against 20/s: before, each got the whole rate.
    let streams: Vec<_> = (0..4)
        .map(|_| q.open(Some("gateway-a")).expect("opens"))
        .collect();
    for (id, _) in &streams {
        q.answer(*id, &report(vec![usage(&key, 1, 0, 0)]))
            .expect("present");
    }
    clock.advance(Duration::from_secs(5));
    let mut total = 0.0;
    for (id, _) in &streams {
        clock.advance(Duration::from_millis(10));
        let r = q
            .answer(*id, &report(vec![usage(&key, 75, 0, 5)]))
            .expect("present");
        total += rate_of(&one(&r));
    }
    tick(&q);
    let json = q.to_json(1);
    let clients: Vec<String> = json["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .map(|s| s["client"].as_str().expect("client").to_owned())
        .collect();
    assert_eq!(clients[0], "gateway-a", "the first holds the name");
    assert!(clients[1].starts_with("gateway-a#"), "{clients:?}");
    let shares: f64 = json["buckets"][0]["assignments"]
        .as_array()
        .expect("assignments")
        .iter()
        .map(|a| {
            a["assignment"]["token_bucket"]["share_per_second"]
                .as_f64()
                .expect("a share")
        })
        .sum();
    assert!(
        shares <= 20.0 * 1.12,
        "the four shares add up to {shares} for 20/s ({total} as answered)"
    );
}
