//! Resetting counters (an operator's `POST /counters/reset`): a check's keys
//! deleted in Redis, one call per hash slot (so each slot's keys go
//! together), and what this process remembers of them (the over-limit
//! cache, leases) forgotten.

use std::collections::BTreeMap;

use redis::Value;

use super::RedisStore;
use super::keys::{Slot, key_names, slot_of};
use super::per_second::is_per_second;
use crate::clock::Nanos;
use crate::store::{Check, StoreError};

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
        let mut by_slot: BTreeMap<Slot, Vec<String>> = BTreeMap::new();
        for check in &here {
            let window = check.quota.window_at(now).index;
            let (names, n) = key_names(&self.inner.options.prefix, &check.key, window);
            for name in names.into_iter().take(n) {
                by_slot
                    .entry(slot_of(name.as_bytes()))
                    .or_default()
                    .push(name);
            }
        }
        let timeout = self.inner.options.timeout;
        for (slot, names) in by_slot {
            let mut inv = self.inner.reset.prepare_invoke();
            for name in &names {
                inv.key(name.as_str());
            }
            let reply = tokio::time::timeout(timeout, self.invoke(slot, &inv))
                .await
                .map_err(|_| StoreError::Timeout(timeout))??;
            match reply {
                Value::Int(n) => deleted += usize::try_from(n).unwrap_or(0),
                other => {
                    return Err(StoreError::Script(format!("reset: DEL answered {other:?}")));
                }
            }
        }
        let here: Vec<Check> = here.into_iter().cloned().collect();
        if let Some(cache) = &self.inner.over_limit {
            cache.forget(&here);
        }
        self.inner.leases.forget(&here);
        Ok(deleted)
    }
}
