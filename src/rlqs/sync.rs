//! The once-a-second tick: reloads followed, stale state dropped, the
//! exchange with the store, and the pushes of what changed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse;

use super::bucket::Resolved;
use super::options::DEMAND_STALE;
use super::quotas::Quotas;
use super::share;
use crate::store::Store;
use crate::store::redis::QuotaExchange;

impl Quotas {
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
                    .push(self.action(&bucket.entries, &assignment));
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
