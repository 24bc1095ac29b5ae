//! Each instance's view of who is being limited, kept in Redis so that any
//! instance can show them merged (`/limited?scope=merged`): one hash, a
//! field per instance, in one Cluster slot.

use super::RedisStore;
use super::keys::slot_of;
use crate::store::StoreError;

impl RedisStore {
    /// The hash of views (one hash tag: one slot).
    fn views_key(&self) -> String {
        format!("{}{{limited}}:views", self.inner.options.prefix)
    }

    /// Stores `view` (JSON) as `instance`'s; the hash expires `keep` after
    /// the last instance wrote.
    pub(crate) async fn put_view(
        &self,
        instance: &str,
        view: &str,
        keep: std::time::Duration,
    ) -> Result<(), StoreError> {
        let key = self.views_key();
        let mut inv = self.inner.scripts.views.prepare_invoke();
        inv.key(key.as_str())
            .arg("put")
            .arg(instance)
            .arg(view)
            .arg(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX));
        self.bounded(self.invoke(slot_of(key.as_bytes()), &inv))
            .await?;
        Ok(())
    }

    /// Every instance's stored view: `(instance, JSON)`.
    pub(crate) async fn views(&self) -> Result<Vec<(String, String)>, StoreError> {
        let key = self.views_key();
        let mut inv = self.inner.scripts.views.prepare_invoke();
        inv.key(key.as_str()).arg("get");
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
