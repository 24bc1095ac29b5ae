//! Each instance's view of who is being limited, kept in Redis so that any
//! instance can show them merged (`/limited?scope=merged`): one hash, a
//! field per instance, and one of when Redis last heard from each, in one
//! Cluster slot. Views are data from other processes: bounded in size when
//! written and before they are read, dated by Redis's clock, and dropped
//! once their instance stops writing (`views.lua`).

use super::RedisStore;
use super::keys::slot_of;
use crate::store::StoreError;

impl RedisStore {
    /// The hash of views (one hash tag: one slot).
    fn views_key(&self) -> String {
        format!("{}{{limited}}:views", self.inner.options.prefix)
    }

    /// When each instance last wrote its view (Redis's clock, ms).
    fn written_key(&self) -> String {
        format!("{}{{limited}}:written", self.inner.options.prefix)
    }

    /// Stores `view` (JSON) as `instance`'s, kept `keep` after it was
    /// written, unless it is above `max_bytes` (then it is not written, and
    /// the error says so); drops the views of instances silent for longer.
    pub(crate) async fn put_view(
        &self,
        instance: &str,
        view: &str,
        (keep, max_bytes): (std::time::Duration, usize),
    ) -> Result<(), StoreError> {
        let key = self.views_key();
        let written = self.written_key();
        let mut inv = self.inner.scripts.views.prepare_invoke();
        inv.key(key.as_str())
            .key(written.as_str())
            .arg("put")
            .arg(instance)
            .arg(view)
            .arg(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX))
            .arg(max_bytes);
        match self
            .bounded(self.invoke(slot_of(key.as_bytes()), &inv))
            .await?
        {
            redis::Value::Int(1) => Ok(()),
            _ => Err(StoreError::Script(format!(
                "a view of {} bytes is above the bound of {max_bytes}: not published",
                view.len()
            ))),
        }
    }

    /// The instances' views written within `keep` (by Redis's clock; a
    /// date ahead of it is not recent), each at most `max_bytes` (larger
    /// ones are not read), at most `max_views` of them: `(instance, JSON)`.
    pub(crate) async fn views(
        &self,
        (keep, max_bytes, max_views): (std::time::Duration, usize, usize),
    ) -> Result<Vec<(String, String)>, StoreError> {
        let key = self.views_key();
        let written = self.written_key();
        let mut inv = self.inner.scripts.views.prepare_invoke();
        inv.key(key.as_str())
            .key(written.as_str())
            .arg("get")
            .arg(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX))
            .arg(max_bytes)
            .arg(max_views);
        let reply = self
            .bounded(self.invoke(slot_of(key.as_bytes()), &inv))
            .await?;
        let flat: Vec<String> = redis::from_redis_value(reply)
            .map_err(|e| StoreError::Script(format!("views: {e}")))?;
        Ok(flat
            .chunks(2)
            .filter_map(|p| match p {
                [field, value] => Some((field.clone(), value.clone())),
                _ => None,
            })
            .collect())
    }

    /// `call` within the store's timeout.
    pub(super) async fn bounded<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let timeout = self.inner.options.timeout;
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(timeout))?
    }
}
