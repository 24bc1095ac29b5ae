//! The quota service's state: streams, buckets, each client's demand, and
//! what each stream was last told. Everything here runs under one lock and
//! never waits: reports are answered from the state as it is; the store is
//! consulted by [`Quotas::tick`] once a second, outside the lock.
//!
//! Time is an argument (the clock is read at the edges: see `handles.rs`),
//! so tests move it by hand.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::answer::{Action, ActionKind, Answer, Entries, Usage};
use super::bucket::{Bucket, Demand, Member, OtherInstances, Resolved, resolve, unmatched};
use super::error::QuotaError;
use super::handles::Handles;
use super::options::{MAX_CLIENT_NAME, QuotaOptions};
use super::outbox::{Inbox, Outbox, outbox};
use super::share::{self, Assignment};
use crate::clock::Nanos;
use crate::rules::RuleSet;

/// One open stream.
#[derive(Debug)]
pub(super) struct Stream {
    /// The name it holds, when it named itself and no other open stream
    /// held that name: its demand outlives the stream, so its share
    /// survives a reconnect.
    pub(super) name: Option<Arc<str>>,
    /// How operators see it: its name, `name#id` when another open stream
    /// holds the name (a client is a stream, never a name alone), or
    /// `stream-id`.
    pub(super) label: Arc<str>,
    pub(super) domain: Option<String>,
    pub(super) tx: Outbox,
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
    /// The names open streams hold.
    pub(super) names: HashSet<Arc<str>>,
    /// (stream, bucket) pairs held: every stream's buckets added up.
    pub(super) pairs: usize,
    /// What the buckets' names and entries take (see [`Bucket::bytes_of`]).
    pub(super) bucket_bytes: usize,
    pub(super) per_rule: BTreeMap<(String, String), RuleCounters>,
}

/// Counters of the quota service.
#[derive(Debug, Default)]
pub(crate) struct QuotaMetrics {
    /// Usage report messages received.
    pub reports: AtomicU64,
    /// Bucket usages in those messages.
    pub bucket_reports: AtomicU64,
    /// Bucket usages ignored: no id, too many entries, too long, or past
    /// `max_buckets`, `max_bucket_bytes`, `max_buckets_per_stream` or
    /// `max_pairs`.
    pub buckets_refused: AtomicU64,
    /// Assignments made for streams, by action.
    pub assignments: AssignmentCounters,
    /// Exchanges with the store that failed.
    pub store_errors: AtomicU64,
    /// Streams ever opened.
    pub streams_opened: AtomicU64,
    /// Streams ended because they did not read their answers.
    pub streams_ended: AtomicU64,
}

/// Assignments made for streams, by action.
#[derive(Debug, Default)]
pub(crate) struct AssignmentCounters {
    pub token_bucket: AtomicU64,
    pub allow_all: AtomicU64,
    pub deny_all: AtomicU64,
    pub abandon: AtomicU64,
}

/// The quota service's state; see the module documentation.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct Quotas {
    pub(super) handles: Handles,
    pub(super) options: QuotaOptions,
    pub(super) state: Mutex<State>,
    /// Counters, read by [`Quotas::metrics_snapshot`].
    pub(crate) metrics: QuotaMetrics,
}

impl Quotas {
    /// The quota service over these rules, store and clock.
    #[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
    pub fn new(handles: Handles, options: QuotaOptions) -> Self {
        let rules = (handles.rules)();
        Self {
            handles,
            options,
            state: Mutex::new(State {
                rules,
                buckets: HashMap::new(),
                streams: HashMap::new(),
                next_stream: 0,
                names: HashSet::new(),
                pairs: 0,
                bucket_bytes: 0,
                per_rule: BTreeMap::new(),
            }),
            metrics: QuotaMetrics::default(),
        }
    }

    /// Its settings.
    pub(crate) fn options(&self) -> &QuotaOptions {
        &self.options
    }

    /// The time now, by its clock: for its edges (a report arriving, the
    /// admin view, the ticker).
    #[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
    pub fn now(&self) -> Nanos {
        self.handles.now()
    }

    pub(super) fn shared_store(&self) -> bool {
        self.handles.share.is_some()
    }

    /// Opens a stream for `client` (a name the client gave, or none) and
    /// returns its id and what it will receive; RESOURCE_EXHAUSTED past
    /// `max_streams`.
    #[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
    pub fn open(&self, client: Option<&str>) -> Result<(u64, Inbox), QuotaError> {
        let (tx, rx) = outbox(self.options.max_queued_bytes);
        let mut state = self.state.lock();
        if state.streams.len() >= self.options.max_streams {
            return Err(QuotaError::TooManyStreams {
                open: state.streams.len(),
            });
        }
        let id = state.next_stream;
        state.next_stream += 1;
        let cut = |name: &str| -> Arc<str> {
            name.chars()
                .take(MAX_CLIENT_NAME)
                .collect::<String>()
                .into()
        };
        let (name, label) = match client {
            Some(given) => {
                let given = cut(given);
                if state.names.insert(given.clone()) {
                    (Some(given.clone()), given)
                } else {
                    // Another open stream holds the name: this one is a
                    // client of its own (two gateways deployed with one
                    // name must not each get the whole rate).
                    (None, format!("{given}#{id}").into())
                }
            }
            None => (None, format!("stream-{id}").into()),
        };
        state.streams.insert(
            id,
            Stream {
                name,
                label,
                domain: None,
                tx,
                buckets: HashSet::new(),
            },
        );
        self.metrics.streams_opened.fetch_add(1, Ordering::Relaxed);
        Ok((id, rx))
    }

    /// Where stream `id`'s answers go (`None` once it is closed).
    pub(super) fn sender(&self, id: u64) -> Option<Outbox> {
        self.state.lock().streams.get(&id).map(|s| s.tx.clone())
    }

    /// Forgets stream `id` at `now`. A client that holds its name keeps its
    /// demand until it goes stale (pooled): reconnected, it finds its share
    /// where it was.
    pub(crate) fn close(&self, id: u64, now: Nanos) {
        let mut state = self.state.lock();
        let state = &mut *state;
        let Some(stream) = state.streams.remove(&id) else {
            return;
        };
        if let Some(name) = &stream.name {
            state.names.remove(name);
        }
        for bucket_name in &stream.buckets {
            let Some(bucket) = state.buckets.get_mut(bucket_name) else {
                continue;
            };
            if let Some(member) = bucket.members.remove(&id) {
                state.pairs = state.pairs.saturating_sub(1);
                if let Some(name) = &stream.name {
                    bucket.depart(name.clone(), member.demand);
                }
                // Divided again now only if the split is older than its
                // refresh interval (else by the next report or tick): a
                // thousand streams closing do not each split the bucket.
                bucket.refresh(now, self.options.min_share);
            }
        }
    }

    /// Exchanges with the store that failed so far (for the tests).
    #[cfg(feature = "test-util")]
    pub fn store_errors(&self) -> u64 {
        self.metrics.store_errors.load(Ordering::Relaxed)
    }

    /// Checks a report's domain before anything of it is read.
    pub(super) fn check_domain(&self, domain: &str) -> Result<(), QuotaError> {
        if domain.is_empty() {
            return Err(QuotaError::NoDomain);
        }
        if domain.len() > self.options.max_value_bytes {
            return Err(QuotaError::DomainTooLong {
                bytes: domain.len(),
                max: self.options.max_value_bytes,
            });
        }
        Ok(())
    }

    /// Takes stream `id`'s usages of `domain` at `now` (each bucket once,
    /// see `wire.rs`) and answers every bucket in them. A stream carries
    /// one domain: a report for another is an error.
    pub(super) fn report(
        &self,
        id: u64,
        domain: &str,
        usages: Vec<Usage>,
        now: Nanos,
    ) -> Result<Answer, QuotaError> {
        let shared_store = self.shared_store();
        let rules = (self.handles.rules)();
        let mut state = self.state.lock();
        let state = &mut *state;
        let stream = state.streams.get_mut(&id).ok_or(QuotaError::StreamClosed)?;
        match &stream.domain {
            None => stream.domain = Some(domain.to_owned()),
            Some(d) if d != domain => {
                return Err(QuotaError::OtherDomain {
                    started: d.clone(),
                    this: domain.to_owned(),
                });
            }
            Some(_) => {}
        }
        let mut answer = Answer::new(self.options.assignment_ttl, usages.len());
        for usage in usages {
            // Rules reloaded since the last tick apply to new buckets at
            // once; existing ones follow at the tick (which also tells
            // Envoy).
            let existing = state.buckets.get(&usage.name);
            let joined = existing.is_none_or(|b| !b.members.contains_key(&id));
            if existing.is_none() {
                let resolved = resolve(&rules, domain, &usage.entries);
                if matches!(resolved, Resolved::Unmatched) {
                    // Nothing to divide or count: answered without a trace,
                    // so junk cannot fill the tables.
                    answer
                        .actions
                        .push(self.action(&usage.entries, &unmatched(&self.options)));
                    continue;
                }
                let bytes = Bucket::bytes_of(&usage.name);
                if state.buckets.len() >= self.options.max_buckets
                    || state.bucket_bytes.saturating_add(bytes) > self.options.max_bucket_bytes
                {
                    self.metrics.buckets_refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if self.over_stream_bounds(stream.buckets.len(), state.pairs) {
                    continue;
                }
                state.bucket_bytes += bytes;
                state.buckets.insert(
                    usage.name.clone(),
                    Bucket::new(usage.name.clone(), domain, usage.entries.clone(), resolved),
                );
            } else if joined && self.over_stream_bounds(stream.buckets.len(), state.pairs) {
                continue;
            }
            let Some(bucket) = state.buckets.get_mut(&usage.name) else {
                continue;
            };
            let member = bucket.members.entry(id).or_insert_with(|| {
                // A named client back on a new stream takes its demand back.
                let demand = stream
                    .name
                    .as_ref()
                    .and_then(|n| bucket.departed.remove(n))
                    .unwrap_or(Demand {
                        rate: None,
                        at: now,
                    });
                Member { demand, sent: None }
            });
            member.demand.at = now;
            // Envoy's first report for a new bucket covers no time (it is
            // sent when the bucket's first request arrives): no rate yet.
            if usage.elapsed >= 1.0 {
                let requests = usage.allowed.saturating_add(usage.denied);
                member.demand.rate = Some(requests as f64 / usage.elapsed);
            }
            let demand = member.demand.rate;
            let sent = member.sent;
            let counted = usage
                .allowed
                .min(bucket.admissible(sent.as_ref(), usage.elapsed));
            bucket.count(counted, usage.elapsed, now, shared_store);
            // The split is made again at most every 10 ms: a stream joining
            // a bucket of 10,000 costs O(1), not a split over all of them.
            let mut fresh_split = bucket.refresh(now, self.options.min_share);
            if joined {
                state.pairs += 1;
                // The bucket's own name, shared: not the report's copy.
                stream.buckets.insert(bucket.name.clone());
                if bucket.members.len() == 1 && !fresh_split {
                    bucket.resplit(now, self.options.min_share);
                    fresh_split = true;
                }
            }
            if let Some(rule) = bucket.resolved.rule() {
                let counters = state
                    .per_rule
                    .entry((domain.to_owned(), rule.path.clone()))
                    .or_default();
                counters.allowed = counters.allowed.saturating_add(usage.allowed);
                counters.denied = counters.denied.saturating_add(usage.denied);
            }
            // Every report is answered (which renews the TTL), with what the
            // stream holds unless the assignment moved.
            let fresh = if joined && !fresh_split {
                bucket.newcomer_assignment(demand, now, &self.options)
            } else {
                bucket.assignment(demand, now, &self.options)
            };
            let assignment = share::to_send(sent.as_ref(), fresh)
                .or(sent)
                .unwrap_or(fresh);
            if let Some(member) = bucket.members.get_mut(&id) {
                member.sent = Some(assignment);
            }
            answer
                .actions
                .push(self.action(&bucket.entries, &assignment));
        }
        Ok(answer)
    }

    /// Whether a stream holding `held` buckets may not take one more, with
    /// `pairs` held by all (counted as refused when it may not).
    fn over_stream_bounds(&self, held: usize, pairs: usize) -> bool {
        let over = held >= self.options.max_buckets_per_stream || pairs >= self.options.max_pairs;
        if over {
            self.metrics.buckets_refused.fetch_add(1, Ordering::Relaxed);
        }
        over
    }

    /// After a reload: buckets whose rule is gone are abandoned (Envoy drops
    /// them until their next request, which finds the new rules); buckets
    /// whose limit changed are re-resolved (the next push tells Envoy).
    /// Returns the abandon actions per stream.
    pub(super) fn follow_rules(&self, state: &mut State, now: Nanos) -> HashMap<u64, Vec<Action>> {
        let mut abandoned: HashMap<u64, Vec<Action>> = HashMap::new();
        let current = (self.handles.rules)();
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
            if resolved.rule().is_none() {
                for stream in bucket.members.keys() {
                    abandoned
                        .entry(*stream)
                        .or_default()
                        .push(self.abandon(&bucket.entries));
                }
                gone.push(name.clone());
            } else {
                bucket.resolved = resolved;
                bucket.global = OtherInstances::default();
                bucket.resplit(now, self.options.min_share);
            }
        }
        for name in gone {
            let Some(bucket) = state.buckets.remove(&name) else {
                continue;
            };
            state.bucket_bytes = state.bucket_bytes.saturating_sub(Bucket::bytes_of(&name));
            state.pairs = state.pairs.saturating_sub(bucket.members.len());
            for id in bucket.members.keys() {
                if let Some(stream) = state.streams.get_mut(id) {
                    stream.buckets.remove(&name);
                }
            }
        }
        abandoned
    }
}

impl Quotas {
    /// An assignment of the bucket with `entries`, counted as sent.
    pub(super) fn action(&self, entries: &Entries, assignment: &Assignment) -> Action {
        let sent = &self.metrics.assignments;
        let counter = match assignment {
            Assignment::TokenBucket { .. } => &sent.token_bucket,
            Assignment::AllowAll => &sent.allow_all,
            Assignment::DenyAll => &sent.deny_all,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Action {
            bucket: entries.clone(),
            kind: ActionKind::Assign(*assignment),
        }
    }

    /// The bucket with `entries` is abandoned, counted as sent.
    pub(super) fn abandon(&self, entries: &Entries) -> Action {
        self.metrics
            .assignments
            .abandon
            .fetch_add(1, Ordering::Relaxed);
        Action {
            bucket: entries.clone(),
            kind: ActionKind::Abandon,
        }
    }
}
