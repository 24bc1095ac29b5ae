//! How a script is sent: every script the store uses (each a `.lua` file
//! beside this one, made by its constructor on [`Lua`]), by its SHA1 or its
//! source, and one call of it ([`Invocation`]), behind `ASKING` on a
//! Cluster slot being migrated. Each layer holds the scripts it sends.

use std::sync::Arc;

use super::keys::{Slot, slot_of};
use redis::Value;

const ALGORITHMS: &str = concat!(
    "local ALGORITHMS = {}\n",
    include_str!("fixed_window.lua"),
    include_str!("sliding_window.lua"),
    include_str!("token_bucket.lua"),
    include_str!("sliding_log.lua"),
    include_str!("held.lua"),
);

/// Every script the store sends, each a `.lua` file beside this one.
#[derive(Debug, Clone, Copy)]
pub(super) enum Script {
    /// Decides the checks of one call's parts (the three algorithms, then
    /// the batch driver, `batch.lua`).
    Batch,
    /// Gives back what checks spent (`refund.lua`).
    Refund,
    /// Takes back a call that ran late, by its receipt (`cancel.lua`).
    Cancel,
    /// Deletes counters (`reset.lua`).
    Reset,
    /// Raises the reset epoch (`epoch.lua`).
    Epoch,
    /// Publishes and reads the instances' views of who is limited
    /// (`views.lua`).
    Views,
    /// The quota service's totals exchange (`quota.lua`).
    Quota,
    /// Reads one counter (`peek.lua`): a sliding window's previous window on
    /// a slot being migrated.
    Peek,
}

/// A Lua script: its SHA1 for `EVALSHA`, and its source for `EVAL` when
/// Redis does not have it (a restart, a failover, a node new to a slot).
/// Cheap to clone: a layer that sends it from a task of its own (a
/// cancellation) takes a copy.
#[derive(Clone)]
pub(super) struct Lua {
    hash: Arc<str>,
    code: Arc<str>,
}

impl Lua {
    pub(super) fn new(code: String) -> Self {
        Self {
            hash: redis::Script::new(&code).get_hash().into(),
            code: code.into(),
        }
    }

    /// The script `script`.
    pub(super) fn of(script: Script) -> Self {
        let source = match script {
            Script::Batch => {
                return Self::new(format!("{ALGORITHMS}{}", include_str!("batch.lua")));
            }
            Script::Refund => include_str!("refund.lua"),
            Script::Cancel => include_str!("cancel.lua"),
            Script::Reset => include_str!("reset.lua"),
            Script::Epoch => include_str!("epoch.lua"),
            Script::Views => include_str!("views.lua"),
            Script::Quota => include_str!("quota.lua"),
            Script::Peek => include_str!("peek.lua"),
        };
        Self::new(source.to_owned())
    }

    /// A call of this script, its keys and arguments to be added.
    pub(super) fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            lua: self,
            keys: Vec::new(),
            args: Vec::new(),
            yields_to_migration: false,
        }
    }
}

/// One call of a [`Lua`] script. Unlike the `redis` crate's invocation, it
/// can be sent as `EVAL` behind `ASKING` (a Cluster slot being migrated),
/// and it says which slot its keys are in.
pub(super) struct Invocation<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
    /// A `TRYAGAIN` ends the call with [`StoreError::Migrating`] instead of
    /// being retried: its caller decides it another way (see
    /// `migration.rs`).
    pub(super) yields_to_migration: bool,
}

impl Invocation<'_> {
    /// Its keys, in order.
    pub(super) fn keys(&self) -> &[Vec<u8>] {
        &self.keys
    }

    /// Its arguments, in order.
    #[cfg(test)]
    pub(super) fn args(&self) -> &[Vec<u8>] {
        &self.args
    }

    pub(super) fn key(&mut self, key: impl redis::ToRedisArgs) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub(super) fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The hash slot of its first key (all of its keys share it).
    pub(super) fn slot(&self) -> Slot {
        slot_of(self.keys.first().map_or(&b""[..], Vec::as_slice))
    }

    /// `EVALSHA`, or `EVAL` with the source when `source`.
    fn command(&self, source: bool) -> redis::Cmd {
        let mut cmd = if source {
            redis::cmd("EVAL")
        } else {
            redis::cmd("EVALSHA")
        };
        cmd.arg(if source {
            &*self.lua.code
        } else {
            &*self.lua.hash
        })
        .arg(self.keys.len());
        for key in &self.keys {
            cmd.arg(key.as_slice());
        }
        for arg in &self.args {
            cmd.arg(arg.as_slice());
        }
        cmd
    }

    /// Runs the script on `conn`: by its SHA1, or by its source when Redis
    /// lacks it; `asking` sends it behind `ASKING` (an `ASK` redirection),
    /// with the source, since the importing node may lack the script.
    pub(super) async fn run(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        asking: bool,
    ) -> redis::RedisResult<Value> {
        if asking {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").ignore().add_command(self.command(true));
            let (reply,): (Value,) = pipe.query_async(conn).await?;
            return reply.extract_error();
        }
        match self.command(false).query_async(conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.command(true).query_async(conn).await
            }
            other => other,
        }
    }
}
