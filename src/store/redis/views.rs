//! Each instance's view of who is being limited, kept in Redis so that any
//! instance can show them merged (`/limited?scope=merged`): one hash, a
//! field per instance, and one of when Redis last heard from each, in one
//! Cluster slot. Views are data from other processes: bounded in size when
//! written and before they are read, dated by Redis's clock, and dropped
//! once their instance stops writing (`views.lua`).

use std::time::Duration;

use super::keys::slot_of;
use super::options::RedisOptions;
use super::route::{Route, within};
use super::script::{Lua, Script};
use super::server::Server;
use crate::store::StoreError;

/// The instances' views, kept in the shared Redis; cheap to clone.
#[derive(Clone)]
pub(super) struct Views {
    route: Route,
    script: Lua,
    prefix: String,
    timeout: Duration,
}

impl Views {
    pub(super) fn new(route: Route, options: &RedisOptions) -> Self {
        Self {
            route,
            script: Lua::of(Script::Views),
            prefix: options.prefix.clone(),
            timeout: options.timeout,
        }
    }

    /// The hash of views (one hash tag: one slot).
    fn views_key(&self) -> String {
        format!("{}{{limited}}:views", self.prefix)
    }

    /// When each instance last wrote its view (Redis's clock, ms).
    fn written_key(&self) -> String {
        format!("{}{{limited}}:written", self.prefix)
    }

    /// Stores `view` (JSON) as `instance`'s, kept `keep` after it was
    /// written, unless it is above `max_bytes` (then it is not written, and
    /// the error says so); drops the views of instances silent for longer.
    pub(super) async fn put(
        &self,
        instance: &str,
        view: &str,
        (keep, max_bytes): (std::time::Duration, usize),
    ) -> Result<(), StoreError> {
        let key = self.views_key();
        let written = self.written_key();
        let mut inv = self.script.prepare_invoke();
        inv.key(key.as_str())
            .key(written.as_str())
            .arg("put")
            .arg(instance)
            .arg(view)
            .arg(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX))
            .arg(max_bytes);
        match within(
            self.timeout,
            self.route.invoke(slot_of(key.as_bytes()), &inv),
        )
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
    pub(super) async fn get(
        &self,
        (keep, max_bytes, max_views): (std::time::Duration, usize, usize),
    ) -> Result<Vec<(String, String)>, StoreError> {
        let key = self.views_key();
        let written = self.written_key();
        let mut inv = self.script.prepare_invoke();
        inv.key(key.as_str())
            .key(written.as_str())
            .arg("get")
            .arg(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX))
            .arg(max_bytes)
            .arg(max_views);
        let reply = within(
            self.timeout,
            self.route.invoke(slot_of(key.as_bytes()), &inv),
        )
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
}
