//! Resetting counters (an operator's `POST /counters/reset`): a check's keys,
//! or a rule's or a domain's, deleted in Redis and in the per-second pool,
//! one call per hash slot (so each slot's keys go together); what this
//! process remembers of them (the over-limit caches, leases) forgotten; and
//! the reset epoch raised, so every other instance forgets too
//! ([`ResetWatch`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::error::redis_error;
use super::keys::{KeyNames, Slot, slot_of};
use super::lease::Leases;
use super::options::RedisOptions;
use super::over_limit::OverLimitCache;
use super::route::{Route, within};
use super::script::{Lua, Script};
use super::server::Server;
use crate::clock::Nanos;
use crate::store::{Check, StoreError};

/// How often each instance reads the reset epoch.
pub const RESET_WATCH_EVERY: Duration = Duration::from_millis(100);

/// Which counters a bulk reset takes, by their descriptor's entries.
pub type Wanted<'a> = &'a (dyn Fn(&[(String, String)]) -> bool + Sync);

/// The most keys one SCAN call is asked to look at.
const SCAN_COUNT: usize = 1_000;
/// Keys deleted per script call.
const DELETE_BATCH: usize = 500;
/// Names handled between two yields to the runtime in a bulk reset.
const YIELD_EVERY: usize = 2_000;

/// Where this instance learns of resets made anywhere: the reset epoch,
/// and what to forget when it moves.
#[derive(Clone)]
pub struct ResetWatch {
    epoch: Counters,
    caches: Vec<Arc<OverLimitCache>>,
    leases: Arc<Leases>,
}

impl std::fmt::Debug for ResetWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResetWatch").finish_non_exhaustive()
    }
}

impl ResetWatch {
    /// Watches `epoch`'s reset epoch; forgets `caches` and `leases`.
    pub(super) fn new(
        epoch: Counters,
        caches: Vec<Arc<OverLimitCache>>,
        leases: Arc<Leases>,
    ) -> Self {
        Self {
            epoch,
            caches,
            leases,
        }
    }

    /// Reads the reset epoch; when another instance raised it since
    /// `seen`, forgets every over-limit answer and lease. The server calls
    /// this every [`RESET_WATCH_EVERY`]: a reset anywhere lifts here within
    /// it.
    pub async fn watch(&self, seen: &mut Option<u64>) {
        let Ok(epoch) = self.epoch.read_epoch().await else {
            return;
        };
        if seen.is_some_and(|s| s != epoch) {
            self.forget_all();
        }
        *seen = Some(epoch);
    }

    /// Forgets every key's over-limit answer and lease.
    pub(super) fn forget_all(&self) {
        for cache in &self.caches {
            cache.clear();
        }
        self.leases.clear();
    }
}

/// The counters' keys on one Redis: named, found and deleted, and the reset
/// epoch beside them; cheap to clone.
#[derive(Clone)]
pub(super) struct Counters {
    route: Route,
    reset: Lua,
    epoch: Lua,
    prefix: String,
    timeout: Duration,
}

impl Counters {
    pub(super) fn new(route: Route, options: &RedisOptions) -> Self {
        Self {
            route,
            reset: Lua::of(Script::Reset),
            epoch: Lua::of(Script::Epoch),
            prefix: options.prefix.clone(),
            timeout: options.timeout,
        }
    }

    /// Deletes the counters of `checks` at `now`; returns how many existed.
    pub(super) async fn delete_checks(
        &self,
        checks: &[Check],
        now: Nanos,
    ) -> Result<usize, StoreError> {
        let mut names = Vec::with_capacity(checks.len());
        for check in checks {
            let names_of = KeyNames::of_check(&self.prefix, check, now);
            // A budget's reservations go with its counter.
            if check.quota.budget && check.algorithm == crate::algorithm::Algorithm::FixedWindow {
                names.push(format!("{}:h", names_of.first()));
            }
            names.extend(names_of.into_names());
        }
        self.delete(names).await
    }

    /// The reset epoch's key (one hash tag: one slot).
    fn epoch_key(&self) -> String {
        format!("{}{{resets}}:epoch", self.prefix)
    }

    /// Raises the reset epoch, so every instance forgets what it remembers
    /// ([`ResetWatch`]). The counters are gone already when this runs; if
    /// it fails, the others forget their over-limit answers only as those
    /// end (at the latest when the window does), so the reset is not done:
    /// the error says so, and sending the reset again completes it.
    pub(super) async fn announce(&self) -> Result<(), StoreError> {
        let key = self.epoch_key();
        let mut inv = self.epoch.prepare_invoke();
        inv.key(key.as_str());
        let raised = within(
            self.timeout,
            self.route.invoke(slot_of(key.as_bytes()), &inv),
        )
        .await;
        raised.map(drop).map_err(|error| {
            tracing::warn!(%error, "reset done here, but the other instances were not told");
            StoreError::Redis {
                message: format!(
                    "the counters were deleted, but the other instances were not told ({error}): \
                     their over-limit caches and leases may refuse until their windows end; \
                     send the reset again"
                ),
                transient: true,
            }
        })
    }

    /// Reads the reset epoch with a plain GET (not a script: a script call
    /// every 100 ms would count among the decisions' calls), within the
    /// store's timeout.
    async fn read_epoch(&self) -> Result<u64, StoreError> {
        let key = self.epoch_key();
        let read = async {
            let mut conn = self.route.connection(slot_of(key.as_bytes())).await?;
            let value: Option<u64> = redis::cmd("GET")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .map_err(|e| redis_error(&e))?;
            Ok(value.unwrap_or(0))
        };
        within(self.timeout, read).await
    }

    /// The counters of `domain` (every master's, on a Cluster) whose
    /// descriptor `wanted` accepts: their names, at most `max + 1` of them
    /// (one more than `max` says there are more).
    pub(super) async fn matching(
        &self,
        domain: &str,
        wanted: Option<Wanted<'_>>,
        max: usize,
    ) -> Result<Vec<String>, StoreError> {
        let pattern = KeyNames::domain_pattern(&self.prefix, domain);
        let prefix_len = self.prefix.len();
        let mut found = Vec::new();
        for mut conn in self.route.master_connections().await? {
            let mut cursor = 0u64;
            loop {
                let mut command = redis::cmd("SCAN");
                command
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let scan = command.query_async::<(u64, Vec<String>)>(&mut conn);
                let (next, names) = self.route.timed(scan).await?;
                for name in names {
                    let Some((_, entries)) = KeyNames::parse(&name[prefix_len.min(name.len())..])
                    else {
                        continue;
                    };
                    if !entries.is_empty() && wanted.is_none_or(|w| w(&entries)) {
                        found.push(name);
                        if found.len() > max {
                            return Ok(found);
                        }
                    }
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        }
        Ok(found)
    }

    /// Deletes the keys `names`, each hash slot's in calls of at most
    /// [`DELETE_BATCH`] keys (each call atomic), each within the store's
    /// timeout; returns how many existed.
    pub(super) async fn delete(&self, names: Vec<String>) -> Result<usize, StoreError> {
        // On a Cluster each call holds one slot's keys; a single server
        // takes any keys together, in fewer, fuller calls.
        let groups: Vec<Vec<String>> = if self.route.clustered() {
            let mut by_slot: BTreeMap<Slot, Vec<String>> = BTreeMap::new();
            for (i, name) in names.into_iter().enumerate() {
                by_slot
                    .entry(slot_of(name.as_bytes()))
                    .or_default()
                    .push(name);
                // A domain may have a million counters: the runtime that
                // runs this also answers health checks.
                if i % YIELD_EVERY == YIELD_EVERY - 1 {
                    tokio::task::yield_now().await;
                }
            }
            by_slot.into_values().collect()
        } else {
            vec![names]
        };
        let mut deleted = 0;
        for group in groups {
            let mut names = group.into_iter();
            loop {
                // Each batch is let go once deleted, so freeing a million
                // names is spread over the calls too.
                let batch: Vec<String> = names.by_ref().take(DELETE_BATCH).collect();
                let Some(first) = batch.first() else {
                    break;
                };
                let slot = slot_of(first.as_bytes());
                let mut inv = self.reset.prepare_invoke();
                for name in &batch {
                    inv.key(name.as_str());
                }
                match within(self.timeout, self.route.invoke(slot, &inv)).await? {
                    Value::Int(n) => deleted += usize::try_from(n).unwrap_or(0),
                    other => {
                        return Err(StoreError::Script(format!("reset: DEL answered {other:?}")));
                    }
                }
            }
        }
        Ok(deleted)
    }
}
