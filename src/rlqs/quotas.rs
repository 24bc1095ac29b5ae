//! The quota service's state: streams, buckets, each client's demand, and
//! what each stream was last told. Everything here runs under one lock and
//! never waits: reports are answered from the state as it is; the store is
//! consulted by [`Quotas::tick`] once a second, outside the lock.
//!
//! Time comes from the limiter's clock, so tests move it by hand.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tonic::Status;

use super::bucket::{Bucket, Demand, OtherInstances, bucket_name, resolve};
use super::options::{MAX_CLIENT_NAME, MAX_CLIENTS_PER_BUCKET, PUSH_QUEUE, QuotaOptions};
use super::share;
use super::wire::Outgoing;
use crate::clock::Nanos;
use crate::limiter::Limiter;
use crate::rules::RuleSet;
use crate::store::Store;

/// One open stream.
#[derive(Debug)]
pub(super) struct Stream {
    pub(super) client: Arc<str>,
    /// Whether the client named itself (its demand outlives the stream, so
    /// its share survives a reconnect).
    pub(super) named: bool,
    pub(super) domain: Option<String>,
    pub(super) tx: mpsc::Sender<Outgoing>,
    pub(super) buckets: HashSet<Arc<str>>,
}

/// Requests reported per rule (label: the rule as /rlconfig names it).
#[derive(Debug, Default)]
pub(super) struct RuleCounters {
    pub(super) allowed: u64,
    pub(super) denied: u64,
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) rules: Arc<RuleSet>,
    pub(super) buckets: HashMap<Arc<str>, Bucket>,
    pub(super) streams: HashMap<u64, Stream>,
    pub(super) next_stream: u64,
    pub(super) per_rule: BTreeMap<(String, String), RuleCounters>,
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
    pub(super) limiter: Arc<Limiter>,
    pub(super) options: QuotaOptions,
    pub(super) state: Mutex<State>,
    /// Counters, rendered with [`Quotas::render_metrics`].
    pub metrics: QuotaMetrics,
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

    pub(super) fn now(&self) -> Nanos {
        self.limiter.clock().now()
    }

    pub(super) fn shared_store(&self) -> bool {
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
                        entries,
                        resolved,
                        clients: HashMap::new(),
                        sent: HashMap::new(),
                        global: OtherInstances::default(),
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
            actions.push(self.action(&bucket.entries, &assignment));
        }
        Ok(RateLimitQuotaResponse {
            bucket_action: actions,
        })
    }

    /// After a reload: buckets whose rule is gone are abandoned (Envoy drops
    /// them until their next request, which finds the new rules); buckets
    /// whose limit changed are re-resolved (the next push tells Envoy).
    /// Returns the abandon actions per stream.
    pub(super) fn follow_rules(&self, state: &mut State) -> HashMap<u64, Vec<BucketAction>> {
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
                        .push(self.abandon(&bucket.entries));
                }
                gone.push(name.clone());
            } else {
                bucket.resolved = resolved;
                bucket.global = OtherInstances::default();
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
}
