use std::path::PathBuf;
use std::time::Duration;

use smallvec::smallvec;

use super::*;
use crate::clock::{ManualClock, NANOS_PER_SEC};
use crate::limiter::{Descriptor, Limiter};
use crate::rules::{LoadOptions, load_sources};

const START: Nanos = 1_700_000_000 * NANOS_PER_SEC;

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n";

fn limiter(options: LimitedOptions) -> (Limiter, Arc<Limited>, Arc<ManualClock>) {
    let rules = load_sources(
        &[(PathBuf::from("rules.yaml"), RULES.to_owned())],
        &LoadOptions::default(),
    )
    .expect("rules");
    let clock = Arc::new(ManualClock::new(START));
    let limiter = Limiter::in_memory(rules, clock.clone());
    let limited = Arc::new(Limited::new(options, clock.clone()));
    limiter.set_observers(vec![limited.clone()]);
    (limiter, limited, clock)
}

/// `user`'s request, with a second descriptor the rules do not limit.
fn ask(limiter: &Limiter, user: &str) -> bool {
    let request = Request {
        domain: "api",
        descriptors: smallvec![
            Descriptor {
                entries: smallvec![("user", user)],
                ..Descriptor::default()
            },
            Descriptor {
                entries: smallvec![("path", "/login"), ("method", "POST")],
                ..Descriptor::default()
            },
        ],
        hits_addend: 0,
    };
    over_limit(limiter, &request)
}

/// Whether `limiter` refuses `request` (on the memory store, at once).
fn over_limit(limiter: &Limiter, request: &Request<'_>) -> bool {
    limiter
        .decide_now(request)
        .expect("memory")
        .expect("decided")
        .over_limit
}

#[test]
fn the_view_names_the_heavy_clients_with_their_whole_request() {
    let (limiter, limited, clock) = limiter(LimitedOptions::default());
    // 500 clients within their limit, three over it by 20, 30 and 40.
    for i in 0..500 {
        for _ in 0..5 {
            assert!(!ask(&limiter, &format!("light{i}")));
        }
    }
    for (user, extra) in [("ann", 20), ("bob", 30), ("cy", 40)] {
        for _ in 0..10 + extra {
            ask(&limiter, user);
        }
        clock.advance(Duration::from_millis(10));
    }
    let view = limited.view(None, None, &limiter.rules());
    assert_eq!(view.scope, "instance");
    assert_eq!(view.rules.len(), 1);
    let rule = &view.rules[0];
    assert_eq!(
        (rule.rule.as_str(), rule.domain.as_str()),
        ("api.user", "api")
    );
    assert_eq!(rule.source.as_deref(), Some("rules.yaml:3"));
    assert_eq!(rule.refused, 90);
    let named: Vec<(&str, u64)> = rule
        .clients
        .iter()
        .map(|c| (c.descriptors[0][0].value.as_str(), c.refused))
        .collect();
    assert_eq!(named, [("cy", 40), ("bob", 30), ("ann", 20)]);
    let cy = &rule.clients[0];
    assert_eq!(cy.error, 0, "no slot was taken over");
    assert!((cy.share - 40.0 / 90.0).abs() < 1e-9);
    assert_eq!(
        cy.descriptors[1],
        [
            Entry {
                key: "path".into(),
                value: "/login".into()
            },
            Entry {
                key: "method".into(),
                value: "POST".into()
            },
        ],
        "every descriptor of the request"
    );
    assert!(
        cy.first_refused.starts_with("2023-11-14T22:13:20"),
        "{}",
        cy.first_refused
    );
    // Only the domain asked for; a search by any value of the request.
    assert!(
        limited
            .view(Some("other"), None, &limiter.rules())
            .rules
            .is_empty()
    );
    let found = limited.view(None, Some("bob"), &limiter.rules());
    assert_eq!(found.rules[0].clients.len(), 1);
    let by_path = limited.view(None, Some("/login"), &limiter.rules());
    assert_eq!(by_path.rules[0].clients.len(), 3);
}

#[test]
fn admissions_of_tracked_clients_count_and_the_window_forgets() {
    let (limiter, limited, clock) = limiter(LimitedOptions::default());
    for _ in 0..12 {
        ask(&limiter, "ann");
    }
    // Two minutes on (the sliding window has let go): ten admitted,
    // counted now that ann is tracked.
    clock.advance(Duration::from_secs(120));
    for _ in 0..10 {
        assert!(!ask(&limiter, "ann"));
    }
    let view = limited.view(None, None, &limiter.rules());
    let ann = &view.rules[0].clients[0];
    assert_eq!((ann.refused, ann.admitted), (2, 10));
    // A window (5 minutes) later, nothing is left; the sweep drops the rule.
    clock.advance(Duration::from_secs(300));
    assert!(limited.view(None, None, &limiter.rules()).rules.is_empty());
    limited.sweep();
    let mut held = 0;
    limited.shards.each(|s| held += s.rules.len());
    assert_eq!(held, 0);
}

/// A million distinct refused keys: the view holds its slots, no more.
#[test]
fn a_key_rotation_attack_keeps_the_bound() {
    let options = LimitedOptions {
        clients: 16,
        ..LimitedOptions::default()
    };
    let (limiter, limited, _) = limiter(options);
    let rules = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 0}\n";
    limiter.set_rules(
        load_sources(
            &[(PathBuf::from("r.yaml"), rules.to_owned())],
            &LoadOptions::default(),
        )
        .expect("rules"),
    );
    // A heavy client among them, refused once every 1,000 keys.
    for i in 0..1_000_000u32 {
        assert!(ask(&limiter, &format!("k{i}")));
        if i % 1_000 == 0 {
            ask(&limiter, "heavy");
        }
    }
    let mut clients = 0;
    limited
        .shards
        .each(|s| clients += s.rules.values().map(|r| r.clients.len()).sum::<usize>());
    assert_eq!(clients, 16);
    let view = limited.view(None, None, &limiter.rules());
    assert_eq!(view.rules[0].refused, 1_001_000);
    assert_eq!(view.rules[0].clients.len(), 16);
}

#[test]
fn rules_past_the_bound_are_counted_not_tracked() {
    let options = LimitedOptions {
        rules: 1,
        ..LimitedOptions::default()
    };
    let (limiter, limited, _) = limiter(options);
    let rules = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 0}\n  - key: path\n    descriptors:\n      - key: method\n        rate_limit: {unit: minute, requests_per_unit: 0}\n";
    limiter.set_rules(
        load_sources(
            &[(PathBuf::from("r.yaml"), rules.to_owned())],
            &LoadOptions::default(),
        )
        .expect("rules"),
    );
    // One request refused by both rules is one step: its first refusal.
    ask(&limiter, "ann");
    let metrics = limited.metrics_snapshot(&limiter.rules());
    assert_eq!(metrics.rules.len(), 1);
    assert_eq!(metrics.untracked, 0);
    assert_eq!(metrics.rules[0].ranks, [1]);
    // A request refused by the second rule alone: past the bound.
    let request = Request {
        domain: "api",
        descriptors: smallvec![Descriptor {
            entries: smallvec![("path", "/login"), ("method", "POST")],
            ..Descriptor::default()
        }],
        hits_addend: 0,
    };
    assert!(over_limit(&limiter, &request));
    let metrics = limited.metrics_snapshot(&limiter.rules());
    assert_eq!(metrics.rules.len(), 1);
    assert_eq!(metrics.untracked, 1);
}

#[test]
fn the_view_holds_no_more_than_its_bytes_whatever_the_clients_and_entries() {
    // The smallest bound: 1 MiB shared by the shards, each client counted
    // at its largest.
    let options = LimitedOptions {
        clients: 10_000,
        max_bytes: 1 << 20,
        ..LimitedOptions::default()
    };
    let (limiter, limited, _) = limiter(options);
    let shards = crate::shards::PerThread::<()>::new().len();
    let most = (options.max_bytes / shards / super::sketch::CLIENT_BYTES).max(1);
    let rules = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 0}\n";
    limiter.set_rules(
        load_sources(
            &[(PathBuf::from("r.yaml"), rules.to_owned())],
            &LoadOptions::default(),
        )
        .expect("rules"),
    );
    // 5,000 clients, each with a request of many tiny entries (the most
    // costly shape per byte of text).
    let tiny: Vec<(String, String)> = (0..30).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    for n in 0..5_000 {
        let user = format!("u{n}");
        let mut descriptors = smallvec::SmallVec::new();
        descriptors.push(Descriptor {
            entries: smallvec![("user", user.as_str())],
            ..Descriptor::default()
        });
        descriptors.push(Descriptor {
            entries: tiny.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
            ..Descriptor::default()
        });
        let request = Request {
            domain: "api",
            descriptors,
            hits_addend: 0,
        };
        over_limit(&limiter, &request);
    }
    let view = limited.view(None, None, &limiter.rules());
    let held = view.rules[0].clients.len();
    // This thread's shard holds at most its share (one slot is the rule's).
    assert!(held < most, "{held} clients held, the bound is {most}");
    assert!(held > most / 2, "the bound is used: {held} of {most}");
    assert_eq!(view.rules[0].refused, 5_000, "every refusal counted");
    // Each held client's descriptors stay within their bytes: the tiny
    // entries were cut, and the cut is marked.
    let kept: usize = view.rules[0].clients[0]
        .descriptors
        .iter()
        .map(|d| d.len())
        .sum();
    assert!(kept < 20, "{kept} entries kept");
    assert!(
        view.rules[0].clients[0]
            .descriptors
            .iter()
            .flatten()
            .any(|e| e.value.ends_with("more entries")),
        "{:?}",
        view.rules[0].clients[0].descriptors
    );
}

/// An in-flight cap's refusals name the client, not each request's ID.
#[test]
fn a_caps_refusals_name_the_client_not_the_request_ids() {
    let rules = load_sources(
        &[(
            PathBuf::from("rules.yaml"),
            "domain: api\ndescriptors:\n  - key: user\n    in_flight: {limit: 1, max_hold_seconds: 60}\n"
                .to_owned(),
        )],
        &LoadOptions::default(),
    )
    .expect("rules");
    let clock = Arc::new(ManualClock::new(START));
    let limiter = Limiter::in_memory(rules, clock.clone());
    let limited = Arc::new(Limited::new(LimitedOptions::default(), clock.clone()));
    limiter.set_observers(vec![limited.clone()]);
    let ids: Vec<String> = (0..50).map(|i| format!("req-{i}")).collect();
    for id in &ids {
        let request = Request {
            domain: "api",
            descriptors: smallvec![Descriptor {
                entries: smallvec![("user", "ann"), ("request_id", id.as_str())],
                ..Descriptor::default()
            }],
            hits_addend: 0,
        };
        over_limit(&limiter, &request);
    }
    let view = limited.view(None, None, &limiter.rules());
    let rule = &view.rules[0];
    assert_eq!(rule.refused, 49);
    assert_eq!(rule.clients.len(), 1, "one client: {:?}", rule.clients);
    assert_eq!(rule.clients[0].refused, 49);
    assert_eq!(
        rule.clients[0].descriptors[0].len(),
        1,
        "its entries, not the ID"
    );
}
