//! The once-a-second tick: reloads followed, stale state dropped, the
//! exchange with the store, and the pushes of what changed.
//!
//! The tick's work is proportional to the (stream, bucket) pairs held: each
//! bucket's rate is divided once ([`super::share::Split`]), then each
//! stream's share is read off it. The walk takes the lock a chunk of buckets
//! at a time, so reports (and the port's other work) go on in between.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::answer::{Action, Answer, Entries};
use super::bucket::{Bucket, Resolved};
use super::options::DEMAND_STALE;
use super::quotas::{Quotas, State};
use super::share;
use crate::clock::Nanos;
use crate::store::QuotaExchange;

/// Buckets walked under one hold of the lock.
const TICK_CHUNK: usize = 1024;

impl Quotas {
    /// Once a second: follows reloaded rules, forgets stale clients and
    /// buckets nobody reports, exchanges with the store (Redis: every
    /// instance's weights and usage), and pushes every assignment that
    /// changed.
    #[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
    pub async fn tick(&self, now: Nanos) {
        let (mut pushes, names) = {
            let mut state = self.state.lock();
            let pushes = self.follow_rules(&mut state, now);
            let names: Vec<Arc<str>> = state.buckets.keys().cloned().collect();
            (pushes, names)
        };
        let shared = self.shared_store();
        let mut exchanges = Vec::new();
        for chunk in names.chunks(TICK_CHUNK) {
            {
                let mut state = self.state.lock();
                for name in chunk {
                    if let Some(pending) = expire(&mut state, name, now, self.options.min_share)
                        && shared
                    {
                        exchanges.push(pending);
                    }
                }
            }
            tokio::task::yield_now().await;
        }
        let batch: Vec<QuotaExchange<'_>> = exchanges
            .iter()
            .map(|p| QuotaExchange {
                domain: &p.domain,
                entries: &p.entries,
                instance: &self.options.instance,
                weight: p.weight,
                admitted: p.admitted,
                window: p.window,
                now,
                stale: DEMAND_STALE,
            })
            .collect();
        if let Some(share) = &self.handles.share {
            let results = share.exchange(&batch, self.options.exchange_timeout).await;
            let mut state = self.state.lock();
            for (pending, result) in exchanges.iter().zip(results) {
                let Some(bucket) = state.buckets.get_mut(&pending.name) else {
                    continue;
                };
                let g = &mut bucket.global;
                match result {
                    Ok(totals) => {
                        g.others = (totals.weight - pending.weight).max(0.0);
                        g.synced = Some(now);
                        if g.window < pending.window.index {
                            // A new window that no report has reached yet.
                            g.window = pending.window.index;
                            g.pending = 0;
                        }
                        if g.window == pending.window.index {
                            g.pending = g.pending.saturating_sub(pending.admitted);
                            // What this instance admitted since is added back.
                            g.used = totals.used.saturating_add(g.pending);
                        }
                    }
                    Err(_) => {
                        self.metrics.store_errors.fetch_add(1, Ordering::Relaxed);
                        // The other instances' last weights count for a while
                        // (a failed exchange does not hand this instance's
                        // clients the whole rate at once); without word from
                        // the store for longer, this instance shares the rate
                        // among its own clients.
                        if g.synced
                            .is_some_and(|t| now.saturating_sub(t) > DEMAND_STALE)
                        {
                            g.others = 0.0;
                        }
                    }
                }
            }
        }
        for chunk in names.chunks(TICK_CHUNK) {
            {
                let mut state = self.state.lock();
                for name in chunk {
                    // The split made while expiring is current unless other
                    // instances' weights came in since.
                    self.assign(&mut state, name, now, shared, &mut pushes);
                }
            }
            tokio::task::yield_now().await;
        }
        let senders: Vec<_> = {
            let state = self.state.lock();
            pushes
                .into_iter()
                .filter_map(|(id, actions)| state.streams.get(&id).map(|s| (s.tx.clone(), actions)))
                .collect()
        };
        for (tx, actions) in senders {
            // A full queue means a stream that does not read: the push is
            // dropped (its next report's answer has the current assignments,
            // or the stream is ended for not reading them).
            let _ = tx.push(Answer {
                actions,
                ttl: self.options.assignment_ttl,
            });
        }
    }

    /// Divides bucket `name`'s rate again (when `resplit`) and queues, per
    /// stream, every assignment that moved.
    fn assign(
        &self,
        state: &mut State,
        name: &Arc<str>,
        now: Nanos,
        resplit: bool,
        pushes: &mut HashMap<u64, Vec<Action>>,
    ) {
        let Some(bucket) = state.buckets.get_mut(name) else {
            return;
        };
        if resplit {
            bucket.resplit(now, self.options.min_share);
        }
        let moved: Vec<(u64, share::Assignment)> = bucket
            .members
            .iter()
            .filter_map(|(id, member)| {
                let fresh = bucket.assignment(member.demand.rate, now, &self.options);
                share::to_send(member.sent.as_ref(), fresh).map(|a| (*id, a))
            })
            .collect();
        for (id, assignment) in moved {
            if let Some(member) = bucket.members.get_mut(&id) {
                member.sent = Some(assignment);
            }
            pushes
                .entry(id)
                .or_default()
                .push(self.action(&bucket.entries, &assignment));
        }
    }
}

/// Drops bucket `name`'s streams that stopped reporting it (and departed
/// clients gone stale), and the bucket once nobody is left; returns its
/// exchange with the store, for a limited bucket.
fn expire(state: &mut State, name: &Arc<str>, now: Nanos, min_share: f64) -> Option<Pending> {
    let State {
        buckets,
        streams,
        pairs,
        bucket_bytes,
        ..
    } = state;
    let bucket = buckets.get_mut(name)?;
    bucket.members.retain(|id, member| {
        let keep = now.saturating_sub(member.demand.at) <= DEMAND_STALE;
        if !keep {
            *pairs = pairs.saturating_sub(1);
            if let Some(stream) = streams.get_mut(id) {
                stream.buckets.remove(name);
            }
        }
        keep
    });
    bucket.forget_departed(now);
    if bucket.members.is_empty() && bucket.departed.is_empty() {
        buckets.remove(name);
        *bucket_bytes = bucket_bytes.saturating_sub(Bucket::bytes_of(name));
        return None;
    }
    let window = match &bucket.resolved {
        Resolved::Limited { quota, .. } => quota.window_at(now),
        _ => return None,
    };
    bucket.resplit(now, min_share);
    // What was admitted in a window that has ended is not sent to the next.
    let admitted = if bucket.global.window == window.index {
        bucket.global.pending
    } else {
        0
    };
    Some(Pending {
        name: name.clone(),
        domain: bucket.domain.clone(),
        entries: bucket.entries.clone(),
        weight: bucket.split.local_weight(),
        admitted,
        window,
    })
}

/// A bucket's exchange with the store, prepared under the lock.
#[derive(Debug)]
struct Pending {
    name: Arc<str>,
    domain: String,
    entries: Entries,
    weight: f64,
    admitted: u64,
    window: crate::calendar::Window,
}
