//! Resetting counters (an operator's `POST /counters/reset`): a check's keys,
//! or a rule's or a domain's, deleted in Redis (and in the per-second pool),
//! one call per hash slot (so each slot's keys go together); what this
//! process remembers of them (the over-limit cache, leases) forgotten; and
//! the reset epoch raised, so every other instance forgets too
//! ([`RedisStore::watch_resets`]).

use std::collections::BTreeMap;

use redis::Value;

use super::RedisStore;
use super::keys::{KeyNames, Slot, slot_of, unescape};
use super::per_second::is_per_second;
use crate::clock::Nanos;
use crate::store::{Check, ResetError, StoreError};

impl RedisStore {
    /// Deletes the counters of `checks` at `now` (a sliding window's
    /// previous window too); returns how many existed.
    pub async fn reset(&self, checks: &[Check], now: Nanos) -> Result<usize, StoreError> {
        let (pool, here): (Vec<&Check>, Vec<&Check>) = checks
            .iter()
            .partition(|c| self.inner.per_second.is_some() && is_per_second(c));
        let mut deleted = 0;
        if let (Some(per_second), false) = (&self.inner.per_second, pool.is_empty()) {
            let pool: Vec<Check> = pool.into_iter().cloned().collect();
            deleted += Box::pin(per_second.reset(&pool, now)).await?;
        }
        let mut names = Vec::with_capacity(here.len());
        for check in &here {
            let window = check.quota.window_at(now).index;
            names.extend(KeyNames::of(&self.inner.options.prefix, &check.key, window).into_names());
        }
        deleted += self.delete_names(names).await?;
        let here: Vec<Check> = here.into_iter().cloned().collect();
        if let Some(cache) = &self.inner.over_limit {
            cache.forget(&here);
        }
        self.inner.leases.forget(&here);
        self.announce_reset().await;
        Ok(deleted)
    }

    /// Deletes every counter of `domain` that `wanted` accepts (`None`:
    /// all), here and in the per-second pool: at most `max` of them (more:
    /// nothing is deleted). Every instance forgets what it remembers.
    pub(crate) async fn reset_bulk(
        &self,
        domain: &str,
        wanted: Option<Wanted<'_>>,
        max: usize,
    ) -> Result<usize, ResetError> {
        let names = self
            .counters_of(domain, wanted, max)
            .await
            .map_err(ResetError::Store)?;
        let pooled = match &self.inner.per_second {
            Some(pool) => Box::pin(pool.counters_of(domain, wanted, max))
                .await
                .map_err(ResetError::Store)?,
            None => Vec::new(),
        };
        if names.len() + pooled.len() > max {
            return Err(ResetError::TooMany(max));
        }
        let mut deleted = self.delete_names(names).await.map_err(ResetError::Store)?;
        if let Some(pool) = &self.inner.per_second {
            deleted += Box::pin(pool.delete_names(pooled))
                .await
                .map_err(ResetError::Store)?;
            pool.forget_all();
        }
        self.forget_all();
        self.announce_reset().await;
        Ok(deleted)
    }

    /// Forgets every key's over-limit answer and lease.
    fn forget_all(&self) {
        if let Some(cache) = &self.inner.over_limit {
            cache.clear();
        }
        self.inner.leases.clear();
    }

    /// The reset epoch's key (one hash tag: one slot).
    fn epoch_key(&self) -> String {
        format!("{}{{resets}}:epoch", self.inner.options.prefix)
    }

    /// Raises the reset epoch, so every instance forgets what it remembers
    /// ([`RedisStore::watch_resets`]). The counters are gone already: a
    /// failure here is logged (the others then forget their over-limit
    /// answers only as those end, at the latest when the window does).
    async fn announce_reset(&self) {
        if let Err(error) = self.epoch("bump").await {
            tracing::warn!(%error, "reset done, but the other instances were not told: their over-limit caches answer until their windows end");
        }
    }

    /// Reads the reset epoch with a plain GET (not a script: a script call
    /// every 100 ms would count among the decisions' calls), on the server
    /// or the Cluster master of its slot; a moved slot is read again at the
    /// next tick, once the map is.
    async fn read_epoch(&self) -> Result<u64, StoreError> {
        let key = self.epoch_key();
        let mut conn = match &self.inner.cluster {
            None => self.inner.connections.shared(&self.inner.breaker).await?,
            Some(_) => {
                let node = self.owner(slot_of(key.as_bytes())).await?;
                self.inner
                    .connections
                    .shared_to(node.id, node.breaker.generation(), &node.url)
                    .await?
            }
        };
        let value: Option<u64> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .map_err(|e| super::redis_error(&e))?;
        Ok(value.unwrap_or(0))
    }

    async fn epoch(&self, what: &str) -> Result<u64, StoreError> {
        let key = self.epoch_key();
        let mut inv = self.inner.scripts.epoch.prepare_invoke();
        inv.key(key.as_str()).arg(what);
        match self
            .bounded(self.invoke(slot_of(key.as_bytes()), &inv))
            .await?
        {
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
            other => Err(StoreError::Script(format!(
                "reset epoch: answered {other:?}"
            ))),
        }
    }

    /// Reads the reset epoch; when another instance raised it since
    /// `seen`, forgets every over-limit answer and lease (here and in the
    /// per-second pool). The server calls this every
    /// [`RESET_WATCH_EVERY`]: a reset anywhere lifts here within it.
    pub async fn watch_resets(&self, seen: &mut Option<u64>) {
        let Ok(epoch) = self.bounded(self.read_epoch()).await else {
            return;
        };
        if seen.is_some_and(|s| s != epoch) {
            self.forget_all();
            if let Some(pool) = &self.inner.per_second {
                pool.forget_all();
            }
        }
        *seen = Some(epoch);
    }
}

/// How often each instance reads the reset epoch.
pub const RESET_WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Which counters a bulk reset takes, by their descriptor's entries.
pub type Wanted<'a> = &'a (dyn Fn(&[(String, String)]) -> bool + Sync);

/// The most keys one SCAN call is asked to look at.
const SCAN_COUNT: usize = 1_000;
/// Keys deleted per script call.
const DELETE_BATCH: usize = 500;

impl RedisStore {
    /// The counters of `domain` (every master's, on a Cluster) whose
    /// descriptor `wanted` accepts: their names, at most `max + 1` of them
    /// (one more than `max` says there are more).
    pub(crate) async fn counters_of(
        &self,
        domain: &str,
        wanted: Option<Wanted<'_>>,
        max: usize,
    ) -> Result<Vec<String>, StoreError> {
        let mut pattern = String::new();
        glob_escape(&self.inner.options.prefix, &mut pattern);
        pattern.push('{');
        let mut escaped = String::new();
        super::keys::escape_into(&mut escaped, domain);
        glob_escape(&escaped, &mut pattern);
        pattern.push_str("|*");
        let prefix_len = self.inner.options.prefix.len();
        let mut found = Vec::new();
        let conns = match &self.inner.cluster {
            None => vec![self.inner.connections.shared(&self.inner.breaker).await?],
            Some(cluster) => {
                let mut conns = Vec::new();
                for node in cluster.masters() {
                    conns.push(
                        self.inner
                            .connections
                            .shared_to(node.id, node.breaker.generation(), &node.url)
                            .await?,
                    );
                }
                conns
            }
        };
        for mut conn in conns {
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
                let (next, names) = self.inner.connections.timed(scan).await?;
                for name in names {
                    let Some((_, entries)) = descriptor_of(&name[prefix_len.min(name.len())..])
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
}

impl RedisStore {
    /// Deletes the keys `names`, each hash slot's in calls of at most
    /// [`DELETE_BATCH`] keys (each call atomic), each within the store's
    /// timeout; returns how many existed.
    async fn delete_names(&self, names: Vec<String>) -> Result<usize, StoreError> {
        // On a Cluster each call holds one slot's keys; a single server
        // takes any keys together, in fewer, fuller calls.
        let groups: Vec<Vec<String>> = if self.inner.cluster.is_some() {
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
                let mut inv = self.inner.scripts.reset.prepare_invoke();
                for name in &batch {
                    inv.key(name.as_str());
                }
                match self.bounded(self.invoke(slot, &inv)).await? {
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

/// Names handled between two yields to the runtime in a bulk reset.
const YIELD_EVERY: usize = 2_000;

/// Appends `text` with the glob characters of SCAN's MATCH escaped.
fn glob_escape(text: &str, out: &mut String) {
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// The domain and entries of a counter's name (without the prefix):
/// `{domain|k=v|...}:...`.
fn descriptor_of(name: &str) -> Option<(String, Vec<(String, String)>)> {
    let inner = name.strip_prefix('{')?;
    let end = inner.find('}')?;
    // Counters only (a call's receipt shares the hash tag, not the form).
    let algorithm = inner[end + 1..].strip_prefix(':')?.get(..3)?;
    if !matches!(algorithm, "sw:" | "fw:" | "tb:") {
        return None;
    }
    let inner = &inner[..end];
    let mut parts = inner.split('|');
    let domain = unescape(parts.next()?)?;
    let mut entries = Vec::new();
    for part in parts {
        let (k, v) = part.split_once('=')?;
        entries.push((unescape(k)?, unescape(v)?));
    }
    Some((domain, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_their_descriptor() {
        let (d, e) =
            descriptor_of("{api|user=a%7Cb%3Dc|path=/login%25}:sw:minute:5").expect("parsed");
        assert_eq!(d, "api");
        assert_eq!(
            e,
            [
                ("user".into(), "a|b=c".into()),
                ("path".into(), "/login%".into())
            ]
        );
        let mut p = String::new();
        glob_escape("a*b?[c]", &mut p);
        assert_eq!(p, "a\\*b\\?\\[c\\]");
    }
}
