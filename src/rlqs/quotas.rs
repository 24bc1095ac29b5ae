//! The quota service's state: streams, buckets, each client's demand, and
//! what each stream was last told. Everything here runs under one lock and
//! never waits: reports are answered from the state as it is; the store is
//! consulted by [`Quotas::tick`] once a second, outside the lock.
//!
//! Time comes from the limiter's clock, so tests move it by hand.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tonic::Status;

use super::share::{self, Assignment};
use crate::clock::{NANOS_PER_SEC, Nanos};
use crate::limiter::Limiter;
use crate::rules::{Rule, RuleSet};
use crate::store::Store;
use crate::store::redis::QuotaExchange;

/// How long a client's demand counts after its last report: three of
/// Envoy's report intervals (5 s in Envoy 1.40), so one lost report does
/// not change the shares.
pub const DEMAND_STALE: Nanos = 15 * NANOS_PER_SEC;

/// Periods at least this long are also counted: once a window's admitted
/// requests (as reported, from every instance) reach the limit, the bucket
/// is denied until the window ends. Shorter periods are enforced by the
/// token buckets' rate alone: reports arrive every 5 seconds, too coarse to
/// count a one-second window.
pub const COUNTED_PERIOD_SECONDS: u64 = 60;

/// The most clients whose demand one bucket tracks (live streams, and named
/// clients for 15 s after their stream ended).
pub const MAX_CLIENTS_PER_BUCKET: usize = 4096;

/// The longest client name kept (characters); longer names are cut.
pub const MAX_CLIENT_NAME: usize = 256;

/// Pushes waiting for a slow stream; past it, pushes are skipped (the next
/// report's answer carries the latest assignments anyway).
const PUSH_QUEUE: usize = 16;

/// What a stream receives.
pub type Outgoing = Result<RateLimitQuotaResponse, Status>;

/// Settings of the quota service.
#[derive(Debug, Clone)]
pub struct QuotaOptions {
    /// How long Envoy keeps an assignment without hearing from Tollgate
    /// (whole seconds, as Envoy counts them).
    pub assignment_ttl: Duration,
    /// The least weight of a client, as a share of the bucket's rate.
    pub min_share: f64,
    /// What buckets that match no limit get.
    pub unmatched: Unmatched,
    /// The most buckets tracked at once; reports for more are not answered.
    pub max_buckets: usize,
    /// The most streams open at once (all connections); more are refused.
    pub max_streams: usize,
    /// Entries per bucket id, and bytes per key or value.
    pub max_entries: usize,
    /// Bytes of one bucket key or value, and of the domain.
    pub max_value_bytes: usize,
    /// This instance's name in the shared store.
    pub instance: String,
}

impl Default for QuotaOptions {
    fn default() -> Self {
        Self {
            assignment_ttl: Duration::from_secs(15),
            min_share: 0.05,
            unmatched: Unmatched::Allow,
            max_buckets: 100_000,
            max_streams: 10_000,
            max_entries: 32,
            max_value_bytes: 65_536,
            instance: "tollgate".into(),
        }
    }
}

/// The answer for buckets that match no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unmatched {
    /// Allow all their requests.
    Allow,
    /// Deny all their requests.
    Deny,
}

/// What a bucket's rules say.
#[derive(Debug, Clone)]
enum Resolved {
    /// No rule matches.
    Unmatched,
    /// A rule without a limit, or in shadow mode (Envoy enforces what it is
    /// told, so a rule that must never refuse allows all).
    Unlimited(Arc<Rule>),
    /// A limit.
    Limited {
        rule: Arc<Rule>,
        quota: crate::algorithm::Quota,
        limit: u64,
        period_seconds: u64,
    },
}

impl Resolved {
    fn rule(&self) -> Option<&Arc<Rule>> {
        match self {
            Resolved::Unmatched => None,
            Resolved::Unlimited(rule) | Resolved::Limited { rule, .. } => Some(rule),
        }
    }

    fn same(&self, other: &Resolved) -> bool {
        match (self, other) {
            (Resolved::Unmatched, Resolved::Unmatched) => true,
            (Resolved::Unlimited(a), Resolved::Unlimited(b)) => a.path == b.path,
            // The limit and period are the rule's.
            (Resolved::Limited { rule: a, .. }, Resolved::Limited { rule: b, .. }) => {
                a.path == b.path && a.limit == b.limit
            }
            _ => false,
        }
    }
}

/// The rules of a bucket (entries sorted by key). A descriptor with several
/// limits (`rate_limits`) is held to its lowest rate.
fn resolve(rules: &RuleSet, domain: &str, entries: &[(String, String)]) -> Resolved {
    let borrowed: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let Some((matched, _)) = rules.lookup_bucket(domain, &borrowed) else {
        return Resolved::Unmatched;
    };
    let rate = |r: &Arc<Rule>| {
        r.limit.map_or(f64::INFINITY, |l| {
            f64::from(l.requests_per_unit) / l.period_seconds() as f64
        })
    };
    let Some(rule) = matched
        .rules
        .iter()
        .min_by(|a, b| rate(a).total_cmp(&rate(b)))
    else {
        return Resolved::Unmatched;
    };
    match rule.limit {
        Some(limit) if !rule.shadow_mode => Resolved::Limited {
            rule: rule.clone(),
            quota: limit.quota(),
            limit: u64::from(limit.requests_per_unit),
            period_seconds: limit.period_seconds().max(1),
        },
        _ => Resolved::Unlimited(rule.clone()),
    }
}

/// One client's demand for one bucket.
#[derive(Debug, Clone, Copy)]
struct Demand {
    /// Requests per second (allowed and denied), once a report covered time.
    rate: Option<f64>,
    /// When it last reported.
    at: Nanos,
}

/// What the other instances (through the store) said about a bucket.
#[derive(Debug, Default, Clone, Copy)]
struct Global {
    /// Weight of the other instances' clients.
    others: f64,
    /// The window `used` counts.
    window: u64,
    /// Admitted in `window` by every instance, as of the last exchange
    /// (this instance's own reports included as they arrive).
    used: u64,
    /// Admitted here and not yet sent to the store.
    pending: u64,
    /// When the store last answered.
    synced: Option<Nanos>,
}

/// One bucket.
#[derive(Debug)]
struct Bucket {
    domain: String,
    id: BucketId,
    /// Sorted by key.
    entries: Vec<(String, String)>,
    resolved: Resolved,
    clients: HashMap<Arc<str>, Demand>,
    /// The last assignment sent to each stream that reported the bucket.
    sent: HashMap<u64, Assignment>,
    global: Global,
}

impl Bucket {
    /// The bucket's requests per second, when it has a limit.
    fn rate(&self) -> Option<f64> {
        match &self.resolved {
            Resolved::Limited {
                limit,
                period_seconds,
                ..
            } => Some(*limit as f64 / *period_seconds as f64),
            _ => None,
        }
    }

    /// Each fresh client's weight (see [`share::weight`]).
    fn weights(&self, now: Nanos, min_share: f64) -> Vec<(Arc<str>, f64)> {
        let Some(rate) = self.rate() else {
            return Vec::new();
        };
        let fresh = || {
            self.clients
                .iter()
                .filter(move |(_, d)| now.saturating_sub(d.at) <= DEMAND_STALE)
        };
        let known: Vec<f64> = fresh().filter_map(|(_, d)| d.rate).collect();
        let unknown = if known.is_empty() {
            rate
        } else {
            known.iter().sum::<f64>() / known.len() as f64
        };
        let floor = min_share * rate;
        fresh()
            .map(|(c, d)| (c.clone(), share::weight(d.rate, floor, unknown)))
            .collect()
    }

    /// The assignment for `client` now.
    fn assignment(&self, client: &str, now: Nanos, options: &QuotaOptions) -> Assignment {
        match &self.resolved {
            Resolved::Unmatched => match options.unmatched {
                Unmatched::Allow => Assignment::AllowAll,
                Unmatched::Deny => Assignment::DenyAll,
            },
            Resolved::Unlimited(_) => Assignment::AllowAll,
            Resolved::Limited {
                quota,
                limit,
                period_seconds,
                ..
            } => {
                if *period_seconds >= COUNTED_PERIOD_SECONDS {
                    let window = quota.window_at(now).index;
                    if window == self.global.window && self.global.used >= *limit {
                        return Assignment::DenyAll;
                    }
                }
                let weights = self.weights(now, options.min_share);
                let local: f64 = weights.iter().map(|(_, w)| w).sum();
                let mine = weights
                    .iter()
                    .find(|(c, _)| &**c == client)
                    .map_or(local / weights.len().max(1) as f64, |(_, w)| *w);
                let rate = *limit as f64 / *period_seconds as f64;
                let share = share::share(rate, mine, local + self.global.others);
                share::token_bucket(share, *limit, *period_seconds)
            }
        }
    }

    /// Counts `allowed` requests reported now into the window.
    fn count(&mut self, allowed: u64, now: Nanos, shared_store: bool) {
        let Resolved::Limited {
            quota,
            period_seconds,
            ..
        } = &self.resolved
        else {
            return;
        };
        if *period_seconds < COUNTED_PERIOD_SECONDS {
            return;
        }
        let window = quota.window_at(now).index;
        if window != self.global.window {
            self.global.window = window;
            self.global.used = 0;
        }
        self.global.used = self.global.used.saturating_add(allowed);
        if shared_store {
            self.global.pending = self.global.pending.saturating_add(allowed);
        }
    }
}

/// One open stream.
#[derive(Debug)]
struct Stream {
    client: Arc<str>,
    /// Whether the client named itself (its demand outlives the stream, so
    /// its share survives a reconnect).
    named: bool,
    domain: Option<String>,
    tx: mpsc::Sender<Outgoing>,
    buckets: HashSet<Arc<str>>,
}

/// Requests reported per rule (label: the rule as /rlconfig names it).
#[derive(Debug, Default)]
struct RuleCounters {
    allowed: u64,
    denied: u64,
}

#[derive(Debug)]
struct State {
    rules: Arc<RuleSet>,
    buckets: HashMap<Arc<str>, Bucket>,
    streams: HashMap<u64, Stream>,
    next_stream: u64,
    per_rule: BTreeMap<(String, String), RuleCounters>,
}

/// Counters of the quota service.
#[derive(Debug, Default)]
pub struct QuotaMetrics {
    /// Usage report messages received.
    pub reports: AtomicU64,
    /// Bucket usages in those messages.
    pub bucket_reports: AtomicU64,
    /// Bucket usages ignored: no id, too many entries, too long, or past
    /// `max_buckets`.
    pub buckets_refused: AtomicU64,
    /// Assignments sent: token bucket, allow all, deny all, abandon.
    pub assignments: [AtomicU64; 4],
    /// Exchanges with the store that failed.
    pub store_errors: AtomicU64,
    /// Streams ever opened.
    pub streams_opened: AtomicU64,
}

/// The quota service's state; see the module documentation.
#[derive(Debug)]
pub struct Quotas {
    limiter: Arc<Limiter>,
    options: QuotaOptions,
    state: Mutex<State>,
    /// Counters, rendered with [`Quotas::render_metrics`].
    pub metrics: QuotaMetrics,
}

/// A bucket's canonical name: the domain and the sorted entries.
fn bucket_name(domain: &str, entries: &[(String, String)]) -> Arc<str> {
    let mut name = String::with_capacity(64);
    name.push_str(domain);
    for (k, v) in entries {
        name.push('\u{0}');
        name.push_str(k);
        name.push('\u{0}');
        name.push_str(v);
    }
    name.into()
}

fn seconds(d: Duration) -> PbDuration {
    PbDuration {
        seconds: d.as_secs().max(1) as i64,
        nanos: 0,
    }
}

impl Quotas {
    /// The quota service over `limiter`'s rules, store and clock.
    pub fn new(limiter: Arc<Limiter>, options: QuotaOptions) -> Self {
        let rules = limiter.rules();
        Self {
            limiter,
            options,
            state: Mutex::new(State {
                rules,
                buckets: HashMap::new(),
                streams: HashMap::new(),
                next_stream: 0,
                per_rule: BTreeMap::new(),
            }),
            metrics: QuotaMetrics::default(),
        }
    }

    fn now(&self) -> Nanos {
        self.limiter.clock().now()
    }

    fn shared_store(&self) -> bool {
        matches!(self.limiter.store(), Store::Redis(_))
    }

    /// Opens a stream for `client` (a name the client gave, or none) and
    /// returns its id and what it will receive; RESOURCE_EXHAUSTED past
    /// `max_streams`.
    pub fn open(&self, client: Option<&str>) -> Result<(u64, mpsc::Receiver<Outgoing>), Status> {
        let (tx, rx) = mpsc::channel(PUSH_QUEUE);
        let mut state = self.state.lock();
        if state.streams.len() >= self.options.max_streams {
            return Err(Status::resource_exhausted(format!(
                "{} quota streams are open, the most allowed (--rlqs-max-streams)",
                state.streams.len()
            )));
        }
        let id = state.next_stream;
        state.next_stream += 1;
        let (client, named): (Arc<str>, bool) = match client {
            Some(name) => (
                name.chars()
                    .take(MAX_CLIENT_NAME)
                    .collect::<String>()
                    .into(),
                true,
            ),
            None => (format!("stream-{id}").into(), false),
        };
        state.streams.insert(
            id,
            Stream {
                client,
                named,
                domain: None,
                tx,
                buckets: HashSet::new(),
            },
        );
        self.metrics.streams_opened.fetch_add(1, Ordering::Relaxed);
        Ok((id, rx))
    }

    /// Where stream `id`'s answers go (`None` once it is closed).
    pub fn sender(&self, id: u64) -> Option<mpsc::Sender<Outgoing>> {
        self.state.lock().streams.get(&id).map(|s| s.tx.clone())
    }

    /// Forgets stream `id`. A client that named itself keeps its demand
    /// until it goes stale: reconnected, it finds its share where it was.
    pub fn close(&self, id: u64) {
        let mut state = self.state.lock();
        let Some(stream) = state.streams.remove(&id) else {
            return;
        };
        for name in &stream.buckets {
            if let Some(bucket) = state.buckets.get_mut(name) {
                bucket.sent.remove(&id);
                if !stream.named {
                    bucket.clients.remove(&stream.client);
                }
            }
        }
    }

    /// Takes one usage report of stream `id` and answers every bucket in it.
    /// A stream carries one domain: a report for another is an error.
    pub fn report(
        &self,
        id: u64,
        reports: &RateLimitQuotaUsageReports,
    ) -> Result<RateLimitQuotaResponse, Status> {
        self.metrics.reports.fetch_add(1, Ordering::Relaxed);
        let now = self.now();
        let domain = reports.domain.as_str();
        if domain.is_empty() {
            return Err(Status::invalid_argument("usage reports without a domain"));
        }
        if domain.len() > self.options.max_value_bytes {
            return Err(Status::invalid_argument(format!(
                "domain of {} bytes is above the bound of {} (--max-value-bytes)",
                domain.len(),
                self.options.max_value_bytes
            )));
        }
        let shared_store = self.shared_store();
        // Rules reloaded since the last tick apply to new buckets at once;
        // existing ones follow at the tick (which also tells Envoy).
        let mut state = self.state.lock();
        let state = &mut *state;
        let stream = state
            .streams
            .get_mut(&id)
            .ok_or_else(|| Status::internal("stream closed"))?;
        match &stream.domain {
            None => stream.domain = Some(domain.to_owned()),
            Some(d) if d != domain => {
                return Err(Status::invalid_argument(format!(
                    "a stream carries one domain: it started with '{d}', this report is for '{domain}'"
                )));
            }
            Some(_) => {}
        }
        let client = stream.client.clone();
        let mut actions = Vec::with_capacity(reports.bucket_quota_usages.len());
        for usage in &reports.bucket_quota_usages {
            self.metrics.bucket_reports.fetch_add(1, Ordering::Relaxed);
            let Some(entries) = usage.bucket_id.as_ref().and_then(|b| self.entries(b)) else {
                self.metrics.buckets_refused.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let name = bucket_name(domain, &entries);
            if !state.buckets.contains_key(&name) {
                if state.buckets.len() >= self.options.max_buckets {
                    self.metrics.buckets_refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let resolved = resolve(&self.limiter.rules(), domain, &entries);
                state.buckets.insert(
                    name.clone(),
                    Bucket {
                        domain: domain.to_owned(),
                        id: usage.bucket_id.clone().unwrap_or_default(),
                        entries,
                        resolved,
                        clients: HashMap::new(),
                        sent: HashMap::new(),
                        global: Global::default(),
                    },
                );
            }
            let bucket = state.buckets.get_mut(&name).expect("inserted above");
            let elapsed = usage.time_elapsed.as_ref().map_or(0.0, |d| {
                d.seconds.max(0) as f64 + f64::from(d.nanos.max(0)) / 1e9
            });
            let requests = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            // Envoy's first report for a new bucket covers no time (it is
            // sent when the bucket's first request arrives): no rate yet.
            let rate = (elapsed >= 1.0).then(|| requests as f64 / elapsed);
            // Past the bound, a new client is not tracked: it is weighed as
            // the average client (names cycled by one client cannot grow a
            // bucket without limit).
            let room = bucket.clients.len() < MAX_CLIENTS_PER_BUCKET;
            if room || bucket.clients.contains_key(&client) {
                let demand = bucket.clients.entry(client.clone()).or_insert(Demand {
                    rate: None,
                    at: now,
                });
                demand.at = now;
                if rate.is_some() {
                    demand.rate = rate;
                }
            }
            bucket.count(usage.num_requests_allowed, now, shared_store);
            if let Some(rule) = bucket.resolved.rule() {
                let counters = state
                    .per_rule
                    .entry((domain.to_owned(), rule.path.clone()))
                    .or_default();
                counters.allowed = counters.allowed.saturating_add(usage.num_requests_allowed);
                counters.denied = counters.denied.saturating_add(usage.num_requests_denied);
            }
            // Every report is answered (which renews the TTL), with what the
            // stream holds unless the assignment moved.
            let fresh = bucket.assignment(&client, now, &self.options);
            let sent = bucket.sent.get(&id).copied();
            let assignment = share::to_send(sent.as_ref(), fresh)
                .or(sent)
                .unwrap_or(fresh);
            bucket.sent.insert(id, assignment);
            stream.buckets.insert(name);
            actions.push(self.action(&bucket.id, &assignment));
        }
        Ok(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }

    /// A bucket id's entries, sorted by key; `None` when it is empty or
    /// above the bounds.
    fn entries(&self, id: &BucketId) -> Option<Vec<(String, String)>> {
        if id.bucket.is_empty() || id.bucket.len() > self.options.max_entries {
            return None;
        }
        let max = self.options.max_value_bytes;
        if id
            .bucket
            .iter()
            .any(|(k, v)| k.len() > max || v.len() > max)
        {
            return None;
        }
        let mut entries: Vec<(String, String)> = id
            .bucket
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        entries.sort_unstable();
        Some(entries)
    }

    /// The wire form of an assignment for bucket `id`.
    fn action(&self, id: &BucketId, assignment: &Assignment) -> BucketAction {
        let strategy = match *assignment {
            Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_seconds,
                ..
            } => Strategy::TokenBucket(TokenBucket {
                max_tokens,
                tokens_per_fill: Some(UInt32Value {
                    value: tokens_per_fill,
                }),
                fill_interval: Some(PbDuration {
                    seconds: i64::from(fill_seconds),
                    nanos: 0,
                }),
            }),
        };
        let kind = match assignment {
            Assignment::TokenBucket { .. } => 0,
            Assignment::AllowAll => 1,
            Assignment::DenyAll => 2,
        };
        self.metrics.assignments[kind].fetch_add(1, Ordering::Relaxed);
        BucketAction {
            bucket_id: Some(id.clone()),
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(seconds(self.options.assignment_ttl)),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })),
        }
    }

    fn abandon(&self, id: &BucketId) -> BucketAction {
        self.metrics.assignments[3].fetch_add(1, Ordering::Relaxed);
        BucketAction {
            bucket_id: Some(id.clone()),
            bucket_action: Some(Action::AbandonAction(AbandonAction {})),
        }
    }

    /// After a reload: buckets whose rule is gone are abandoned (Envoy drops
    /// them until their next request, which finds the new rules); buckets
    /// whose limit changed are re-resolved (the next push tells Envoy).
    /// Returns the abandon actions per stream.
    fn follow_rules(&self, state: &mut State) -> HashMap<u64, Vec<BucketAction>> {
        let mut abandoned: HashMap<u64, Vec<BucketAction>> = HashMap::new();
        let current = self.limiter.rules();
        if Arc::ptr_eq(&current, &state.rules) {
            return abandoned;
        }
        state.rules = current;
        let mut gone = Vec::new();
        for (name, bucket) in &mut state.buckets {
            let resolved = resolve(&state.rules, &bucket.domain, &bucket.entries);
            if bucket.resolved.same(&resolved) {
                bucket.resolved = resolved;
                continue;
            }
            let was_limited = bucket.resolved.rule().is_some();
            if was_limited && resolved.rule().is_none() {
                for stream in bucket.sent.keys() {
                    abandoned
                        .entry(*stream)
                        .or_default()
                        .push(self.abandon(&bucket.id));
                }
                gone.push(name.clone());
            } else {
                bucket.resolved = resolved;
                bucket.global = Global::default();
            }
        }
        for name in gone {
            state.buckets.remove(&name);
            for stream in state.streams.values_mut() {
                stream.buckets.remove(&name);
            }
        }
        abandoned
    }

    /// Once a second: follows reloaded rules, forgets stale clients and idle
    /// buckets, exchanges with the store (Redis: every instance's weights
    /// and usage), and pushes every assignment that changed.
    pub async fn tick(&self) {
        let now = self.now();
        let mut pushes;
        let exchanges = {
            let mut state = self.state.lock();
            pushes = self.follow_rules(&mut state);
            let state = &mut *state;
            state.buckets.retain(|_, bucket| {
                bucket
                    .clients
                    .retain(|_, d| now.saturating_sub(d.at) <= DEMAND_STALE);
                !bucket.clients.is_empty() || !bucket.sent.is_empty()
            });
            for stream in state.streams.values_mut() {
                stream
                    .buckets
                    .retain(|name| state.buckets.contains_key(name));
            }
            match self.limiter.store() {
                Store::Redis(_) => state
                    .buckets
                    .iter()
                    .filter_map(|(name, bucket)| {
                        let Resolved::Limited { quota, .. } = &bucket.resolved else {
                            return None;
                        };
                        let weight: f64 = bucket
                            .weights(now, self.options.min_share)
                            .iter()
                            .map(|(_, w)| w)
                            .sum();
                        Some(Pending {
                            name: name.clone(),
                            domain: bucket.domain.clone(),
                            entries: bucket.entries.clone(),
                            weight,
                            admitted: bucket.global.pending,
                            window: quota.window_at(now),
                        })
                    })
                    .collect(),
                Store::Memory(_) => Vec::new(),
            }
        };
        if let Store::Redis(store) = self.limiter.store() {
            let instance = self.options.instance.as_str();
            let results = futures_util::future::join_all(exchanges.iter().map(|p| async move {
                let exchange = QuotaExchange {
                    domain: &p.domain,
                    entries: &p.entries,
                    instance,
                    weight: p.weight,
                    admitted: p.admitted,
                    window: p.window,
                    now,
                    stale: DEMAND_STALE,
                };
                store.exchange_quota(&exchange).await
            }))
            .await;
            let mut state = self.state.lock();
            for (pending, result) in exchanges.iter().zip(results) {
                let Some(bucket) = state.buckets.get_mut(&pending.name) else {
                    continue;
                };
                match result {
                    Ok(totals) => {
                        let g = &mut bucket.global;
                        g.others = (totals.weight - pending.weight).max(0.0);
                        g.pending = g.pending.saturating_sub(pending.admitted);
                        g.window = pending.window.index;
                        // What this instance admitted since is added back.
                        g.used = totals.used.saturating_add(g.pending);
                        g.synced = Some(now);
                    }
                    Err(_) => {
                        self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                        // Without word from the store for a while, the
                        // other instances' clients are no longer counted:
                        // this instance shares the rate among its own.
                        let g = &mut bucket.global;
                        if g.synced
                            .is_none_or(|t| now.saturating_sub(t) > DEMAND_STALE)
                        {
                            g.others = 0.0;
                        }
                    }
                }
            }
        }
        let mut state = self.state.lock();
        let state = &mut *state;
        for bucket in state.buckets.values_mut() {
            let streams: Vec<u64> = bucket.sent.keys().copied().collect();
            for id in streams {
                let Some(stream) = state.streams.get(&id) else {
                    bucket.sent.remove(&id);
                    continue;
                };
                let fresh = bucket.assignment(&stream.client, now, &self.options);
                let Some(assignment) = share::to_send(bucket.sent.get(&id), fresh) else {
                    continue;
                };
                bucket.sent.insert(id, assignment);
                pushes
                    .entry(id)
                    .or_default()
                    .push(self.action(&bucket.id, &assignment));
            }
        }
        for (id, actions) in pushes {
            if let Some(stream) = state.streams.get(&id) {
                // A full queue means a stream that does not read: it gets
                // the current assignments with its next report's answer.
                let _ = stream.tx.try_send(Ok(RateLimitQuotaResponse {
                    bucket_action: actions,
                }));
            }
        }
    }

    /// The Prometheus lines of the quota service.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let now = self.now();
        let state = self.state.lock();
        let m = &self.metrics;
        let gauge = |out: &mut String, name: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        };
        gauge(
            out,
            "tollgate_rlqs_streams",
            "Open quota streams.",
            state.streams.len() as f64,
        );
        gauge(
            out,
            "tollgate_rlqs_buckets",
            "Quota buckets tracked.",
            state.buckets.len() as f64,
        );
        let counters = [
            (
                "tollgate_rlqs_streams_opened_total",
                "Quota streams opened.",
                &m.streams_opened,
            ),
            (
                "tollgate_rlqs_reports_total",
                "Usage report messages received.",
                &m.reports,
            ),
            (
                "tollgate_rlqs_bucket_reports_total",
                "Bucket usages received.",
                &m.bucket_reports,
            ),
            (
                "tollgate_rlqs_buckets_refused_total",
                "Bucket usages not answered: empty id, above --max-entries or --max-value-bytes, or past --rlqs-max-buckets.",
                &m.buckets_refused,
            ),
            (
                "tollgate_rlqs_store_errors_total",
                "Failed exchanges with the store.",
                &m.store_errors,
            ),
        ];
        for (name, help, value) in counters {
            counter(out, name, help, value.load(Ordering::Relaxed));
        }
        let _ = writeln!(
            out,
            "# HELP tollgate_rlqs_assignments_total Assignments sent, by action.\n# TYPE tollgate_rlqs_assignments_total counter"
        );
        for (i, action) in ["token_bucket", "allow_all", "deny_all", "abandon"]
            .iter()
            .enumerate()
        {
            let _ = writeln!(
                out,
                "tollgate_rlqs_assignments_total{{action=\"{action}\"}} {}",
                m.assignments[i].load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP tollgate_rlqs_requests_total Requests Envoy reported, per rule and result.\n# TYPE tollgate_rlqs_requests_total counter"
        );
        for ((domain, rule), c) in &state.per_rule {
            for (result, value) in [("allowed", c.allowed), ("denied", c.denied)] {
                let labels = rule_labels(domain, rule);
                let _ = writeln!(
                    out,
                    "tollgate_rlqs_requests_total{{{labels},result=\"{result}\"}} {value}"
                );
            }
        }
        // Global usage per rule: every instance's demand, and what was
        // admitted in the current window (counted periods only).
        let mut demand: BTreeMap<(&str, &str), (f64, u64)> = BTreeMap::new();
        for bucket in state.buckets.values() {
            let Some(rule) = bucket.resolved.rule() else {
                continue;
            };
            let local: f64 = bucket
                .clients
                .values()
                .filter(|d| now.saturating_sub(d.at) <= DEMAND_STALE)
                .filter_map(|d| d.rate)
                .sum();
            let entry = demand.entry((&bucket.domain, &rule.path)).or_default();
            entry.0 += local;
            entry.1 += bucket.global.used;
        }
        // (name, help, value of one rule's (demand, used))
        type Series = (&'static str, &'static str, fn(&(f64, u64)) -> String);
        let per_rule: [Series; 2] = [
            (
                "tollgate_rlqs_demand",
                "Requests per second this instance's clients reported, per rule.",
                |(rate, _)| rate.to_string(),
            ),
            (
                "tollgate_rlqs_window_used",
                "Requests admitted in the current window by every instance, per rule (periods of a minute or more).",
                |(_, used)| used.to_string(),
            ),
        ];
        for (name, help, value) in per_rule {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for ((domain, rule), v) in &demand {
                let labels = rule_labels(domain, rule);
                let _ = writeln!(out, "{name}{{{labels}}} {}", value(v));
            }
        }
    }

    /// The current assignments as JSON, at most `limit` buckets (sorted by
    /// domain and entries).
    pub fn to_json(&self, limit: usize) -> serde_json::Value {
        use serde_json::json;
        let now = self.now();
        let state = self.state.lock();
        let mut names: Vec<&Arc<str>> = state.buckets.keys().collect();
        names.sort();
        let buckets: Vec<serde_json::Value> = names
            .iter()
            .take(limit)
            .map(|name| {
                let b = &state.buckets[*name];
                let weights = b.weights(now, self.options.min_share);
                let clients: Vec<serde_json::Value> = b
                    .clients
                    .iter()
                    .map(|(client, d)| {
                        json!({
                            "client": &**client,
                            "demand_per_second": d.rate,
                            "reported_seconds_ago": now.saturating_sub(d.at) / NANOS_PER_SEC,
                            "weight": weights.iter().find(|(c, _)| c == client).map(|(_, w)| *w),
                        })
                    })
                    .collect();
                let mut assignments: Vec<(u64, serde_json::Value)> = b
                    .sent
                    .iter()
                    .map(|(id, a)| {
                        let client = state.streams.get(id).map(|s| s.client.to_string());
                        (*id, json!({"stream": id, "client": client, "assignment": assignment_json(a)}))
                    })
                    .collect();
                assignments.sort_by_key(|(id, _)| *id);
                let entries: serde_json::Map<String, serde_json::Value> = b
                    .entries
                    .iter()
                    .map(|(k, v)| (k.clone(), json!(v)))
                    .collect();
                let (rule, limit) = match &b.resolved {
                    Resolved::Unmatched => (None, json!(null)),
                    Resolved::Unlimited(r) => (Some(r.path.clone()), json!("unlimited")),
                    Resolved::Limited {
                        rule,
                        limit,
                        period_seconds,
                        ..
                    } => (
                        Some(rule.path.clone()),
                        json!({
                            "requests": limit,
                            "period_seconds": period_seconds,
                            "per_second": *limit as f64 / *period_seconds as f64,
                        }),
                    ),
                };
                json!({
                    "domain": b.domain,
                    "bucket": entries,
                    "rule": rule,
                    "limit": limit,
                    "other_instances_weight": b.global.others,
                    "window_used": b.global.used,
                    "clients": clients,
                    "assignments": assignments.into_iter().map(|(_, a)| a).collect::<Vec<_>>(),
                })
            })
            .collect();
        let streams: Vec<serde_json::Value> = {
            let mut ids: Vec<&u64> = state.streams.keys().collect();
            ids.sort();
            ids.into_iter()
                .map(|id| {
                    let s = &state.streams[id];
                    json!({"stream": id, "client": &*s.client, "named": s.named, "domain": s.domain, "buckets": s.buckets.len()})
                })
                .collect()
        };
        json!({
            "instance": self.options.instance,
            "buckets_total": state.buckets.len(),
            "buckets": buckets,
            "streams": streams,
        })
    }
}

/// `domain="…",rule="…"`, escaped.
fn rule_labels(domain: &str, rule: &str) -> String {
    let mut labels = String::new();
    crate::metrics::push_label(&mut labels, "domain", domain);
    crate::metrics::push_label(&mut labels, "rule", rule);
    labels.split_off(1)
}

fn assignment_json(a: &Assignment) -> serde_json::Value {
    use serde_json::json;
    match a {
        Assignment::AllowAll => json!({"blanket_rule": "ALLOW_ALL"}),
        Assignment::DenyAll => json!({"blanket_rule": "DENY_ALL"}),
        Assignment::TokenBucket {
            share,
            max_tokens,
            tokens_per_fill,
            fill_seconds,
        } => json!({"token_bucket": {
            "share_per_second": share,
            "max_tokens": max_tokens,
            "tokens_per_fill": tokens_per_fill,
            "fill_interval_seconds": fill_seconds,
        }}),
    }
}

/// A bucket's exchange with the store, prepared under the lock.
#[derive(Debug)]
struct Pending {
    name: Arc<str>,
    domain: String,
    entries: Vec<(String, String)>,
    weight: f64,
    admitted: u64,
    window: crate::calendar::Window,
}
