//! Giving hits back (`refund.lua`): what a refused request committed in
//! other hash slots (Cluster), on the other side of the per-second pool, or
//! key by key on a slot being migrated, so that a refused request spends
//! nothing. A refund that fails leaves the hits spent: the error is only
//! ever on the side of refusing, and the caller logs it.

use std::time::Duration;

use futures_util::future::join_all;

use super::keys::{KeyNames, Slot, check_code, script_code};
use super::options::RedisOptions;
use super::part::Group;
use super::route::Route;
use super::script::{Invocation, Lua, Script};
use super::server::Server;
use crate::algorithm::{Algorithm, NANOS_PER_TICK};
use crate::clock::Nanos;
use crate::store::{Check, StoreError};

/// Refund calls over a [`Route`]; cheap to clone.
#[derive(Clone)]
pub(super) struct Refunds {
    route: Route,
    refund: Lua,
    prefix: String,
    timeout: Duration,
}

impl Refunds {
    pub(super) fn new(route: Route, options: &RedisOptions) -> Self {
        Self {
            route,
            refund: Lua::of(Script::Refund),
            prefix: options.prefix.clone(),
            timeout: options.timeout,
        }
    }

    /// Gives back what the admitted checks of `groups` committed (each
    /// group one script call of its slot), within the store's timeout.
    pub(super) async fn groups<'g>(
        &self,
        checks: &[Check],
        groups: impl Iterator<Item = &'g (Slot, Group)>,
        now: Nanos,
    ) -> Result<(), StoreError> {
        let refunds = groups.map(|(slot, group)| {
            let mut inv = self.refund.prepare_invoke();
            let mut k = 0;
            for &i in &group.checks {
                let c = &checks[i];
                // The counter the hits went to: the first of the check's keys
                // (and a reservation's held IDs, the second).
                inv.key(&group.keys[k]);
                if check_code(c) == b'r' {
                    inv.key(&group.keys[k + 1]);
                }
                k += KeyNames::count_of(c);
                let committed = if c.outcome.is_some_and(|o| o.allowed) {
                    c.charge()
                } else {
                    0
                };
                refund_args(&mut inv, c, committed, now);
            }
            async move { self.route.invoke(*slot, &inv).await }
        });
        self.all(refunds).await
    }

    /// Gives back the hits the admitted `checks` spent at `now` (one request
    /// on one Redis, refused as a whole elsewhere): one call per check,
    /// whose keys share a slot on a Cluster too; within the store's timeout.
    pub(super) async fn checks(&self, checks: &[Check], now: Nanos) -> Result<(), StoreError> {
        let refunds = checks
            .iter()
            .filter(|c| c.outcome.is_some_and(|o| o.allowed) && c.charge() > 0)
            .map(|check| {
                let mut inv = self.refund.prepare_invoke();
                // The counter the hits went to (see refund.lua), and a
                // reservation's held IDs.
                let names = KeyNames::of_check(&self.prefix, check, now);
                let keys = if check_code(check) == b'r' { 2 } else { 1 };
                for name in names.into_names().take(keys) {
                    inv.key(&name);
                }
                refund_args(&mut inv, check, check.charge(), now);
                async move { self.route.invoke(inv.slot(), &inv).await }
            });
        self.all(refunds).await
    }

    /// Gives back `charge` hits of counter `key` in `slot` (`code`: its
    /// algorithm's script code; `interval`: a token bucket's, or a sliding
    /// log's request time, in µs),
    /// within the store's timeout.
    pub(super) async fn key(
        &self,
        slot: Slot,
        key: &str,
        (code, charge, interval): (u8, u64, u64),
    ) -> Result<(), StoreError> {
        let mut inv = self.refund.prepare_invoke();
        inv.key(key)
            .arg(char::from(code).to_string())
            .arg(charge)
            .arg(interval);
        match tokio::time::timeout(self.timeout, self.route.invoke(slot, &inv)).await {
            Ok(reply) => reply.map(|_| ()),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }

    /// Runs `refunds` together within the store's timeout: the first error.
    async fn all(
        &self,
        refunds: impl Iterator<Item = impl Future<Output = Result<redis::Value, StoreError>>>,
    ) -> Result<(), StoreError> {
        match tokio::time::timeout(self.timeout, join_all(refunds)).await {
            Err(_) => Err(StoreError::Timeout(self.timeout)),
            Ok(results) => results
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), Err),
        }
    }
}

/// One check's arguments for `refund.lua`: its algorithm, the `hits` to give
/// back, and the interval between a token bucket's tokens (µs) or, for a
/// sliding log, the request's time `now` (µs: the entry its hits went to).
fn refund_args(inv: &mut Invocation<'_>, check: &Check, hits: u64, now: Nanos) {
    // A slot or a reservation gives its hold back by its ID; a release or a
    // settlement reported what already happened and is never taken back.
    if let Some(hold) = &check.hold {
        match check_code(check) {
            code @ (b'i' | b'r') if hits > 0 => {
                inv.arg(char::from(code).to_string())
                    .arg(hits)
                    .arg(&*hold.id);
            }
            _ => {
                inv.arg("f").arg(0).arg(1);
            }
        }
        return;
    }
    let third = match check.algorithm {
        Algorithm::SlidingLog => now / NANOS_PER_TICK,
        _ => {
            let period = (check.quota.period / NANOS_PER_TICK).max(1);
            (period / u64::from(check.quota.limit.max(1))).max(1)
        }
    };
    inv.arg(script_code(check.algorithm)).arg(hits).arg(third);
}
