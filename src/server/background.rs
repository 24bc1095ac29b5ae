//! The server's background tasks, each started by a method of its own:
//! sweeping, the quota service's ticks, the published view of who is
//! limited, statsd, xDS, TLS renewal, gRPC health and rule reloads. They
//! run on the control runtime until shutdown aborts them.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::{HotReload, TLS_RELOAD_INTERVAL, Tls, set_health};
use crate::health::Health;
use crate::limited::Limited;
use crate::limiter::Limiter;
use crate::reload::Reloader;
use crate::rlqs::Quotas;

/// The tasks started so far.
#[derive(Default)]
pub(super) struct Background(Vec<JoinHandle<()>>);

impl Background {
    /// Runs `task` until [`Background::abort`].
    pub(super) fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.0.push(tokio::spawn(task));
    }

    /// Stops every task.
    pub(super) fn abort(self) {
        for task in self.0 {
            task.abort();
        }
    }

    /// State that can no longer matter is dropped every second, so memory
    /// follows the active keys: the live store's, the candidate rules', and
    /// the view of who is limited. The sweep walks every shard: it runs on a
    /// blocking thread, away from the runtime that answers health checks.
    pub(super) fn sweep(
        &mut self,
        limiter: Arc<Limiter>,
        candidate: Option<Arc<Limiter>>,
        limited: Option<Arc<Limited>>,
    ) {
        self.spawn(every(Duration::from_secs(1), move || {
            limiter.sweep(limiter.clock().now());
            if let Some(c) = &candidate {
                c.sweep(c.clock().now());
            }
            if let Some(l) = &limited {
                l.sweep();
            }
        }));
    }

    /// On a shared store, this instance's view of who is limited is
    /// published for the others' merged view.
    pub(super) fn publish_limited(&mut self, view: Arc<Limited>, limiter: Arc<Limiter>) {
        let Some(share) = limiter.store().views() else {
            return;
        };
        self.spawn(async move {
            let mut tick = ticking(crate::limited::PUBLISH_EVERY);
            loop {
                tick.tick().await;
                if let Err(error) = view.publish(&share, &limiter.rules()).await {
                    tracing::debug!(%error, "the view of who is limited was not published");
                }
            }
        });
    }

    /// On a shared store, a reset made by any instance reaches this one's
    /// over-limit cache and leases within
    /// [`crate::store::redis::RESET_WATCH_EVERY`].
    pub(super) fn reset_watch(&mut self, limiter: Arc<Limiter>) {
        let Some(store) = limiter.store().reset_watcher() else {
            return;
        };
        self.spawn(async move {
            let mut tick = ticking(crate::store::redis::RESET_WATCH_EVERY);
            let mut seen = None;
            loop {
                tick.tick().await;
                store.watch(&mut seen).await;
            }
        });
    }

    /// On a shared store, what Redis could not take while it was down
    /// (releases) is sent within [`crate::store::redis::OWED_EVERY`] of it
    /// answering again.
    pub(super) fn owed_releases(&mut self, limiter: Arc<Limiter>) {
        let Some(owed) = limiter.store().owed_releases() else {
            return;
        };
        self.spawn(async move {
            let mut tick = ticking(crate::store::redis::OWED_EVERY);
            loop {
                tick.tick().await;
                owed.pay(limiter.clock().now()).await;
            }
        });
    }

    /// Quota streams, every second: reloaded rules, the store's totals, and
    /// pushes of assignments that changed.
    pub(super) fn quota_ticks(&mut self, quotas: Arc<Quotas>) {
        self.spawn(async move {
            let mut tick = ticking(Duration::from_secs(1));
            loop {
                tick.tick().await;
                quotas.tick(quotas.now()).await;
            }
        });
    }

    /// Renewed certificates are picked up for new connections.
    pub(super) fn tls_renewal(&mut self, tls: Arc<Tls>) {
        self.spawn(every(TLS_RELOAD_INTERVAL, move || {
            tls.reload_if_changed();
        }));
    }

    /// gRPC health says what /healthcheck says, every second. The liveness
    /// service says only that the gRPC server answers: a store outage or a
    /// drain makes the instance unready, never a restart (the manifests'
    /// liveness probe).
    pub(super) fn grpc_health(
        &mut self,
        limiter: Arc<Limiter>,
        health: Arc<Health>,
        reporter: tonic_health::server::HealthReporter,
    ) {
        let readiness = crate::health::Readiness::of(&limiter);
        self.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let status = match health.check(&readiness).await {
                    Ok(_) => tonic_health::ServingStatus::Serving,
                    Err(_) => tonic_health::ServingStatus::NotServing,
                };
                set_health(&reporter, status).await;
            }
        });
    }

    /// Reloads of the live rules (and the candidate rules with them): on
    /// file changes when watched, and on SIGHUP.
    pub(super) fn rule_reloads(&mut self, live: HotReload, candidate: Option<Arc<Reloader>>) {
        let HotReload { reloader, interval } = live;
        if let Some(interval) = interval {
            let (watcher, candidate_watcher) = (reloader.clone(), candidate.clone());
            self.spawn(every(interval, move || {
                watcher.poll();
                if let Some(c) = &candidate_watcher {
                    c.poll();
                }
            }));
        }
        #[cfg(unix)]
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(mut hangups) => self.spawn(async move {
                while hangups.recv().await.is_some() {
                    let reloader = reloader.clone();
                    let candidate = candidate.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        let _ = reloader.reload("SIGHUP");
                        if let Some(c) = candidate {
                            let _ = c.reload("SIGHUP");
                        }
                    })
                    .await;
                }
            }),
            Err(e) => tracing::warn!("cannot listen for SIGHUP: {e}"),
        }
    }

    /// The admin token file is re-read when it changes and on SIGHUP; the
    /// summary of failed token attempts is logged with the same tick, so a
    /// flood's tail is reported when it stops.
    pub(super) fn admin_tokens(&mut self, access: Arc<crate::admin::Access>) {
        let Some(file) = access.tokens.clone() else {
            return;
        };
        let watched = file.clone();
        self.spawn(every(TOKEN_POLL, move || {
            watched.poll();
            access.failures.flush(std::time::Instant::now());
        }));
        #[cfg(unix)]
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(mut hangups) => self.spawn(async move {
                while hangups.recv().await.is_some() {
                    let file = file.clone();
                    let _ = tokio::task::spawn_blocking(move || file.reload("SIGHUP")).await;
                }
            }),
            Err(e) => tracing::warn!("cannot listen for SIGHUP (admin tokens): {e}"),
        }
    }
}

/// How often the admin token file is looked at: a rotated token works, and
/// the old one stops, within two looks.
const TOKEN_POLL: Duration = Duration::from_millis(250);

/// Runs `work` every `interval` on a blocking thread, never two at once:
/// the sweep walks every shard and the reloads read files, which must not
/// hold up the runtime that answers health checks and admin requests.
async fn every(interval: Duration, work: impl Fn() + Send + Sync + 'static) {
    let work = Arc::new(work);
    let mut tick = ticking(interval);
    loop {
        tick.tick().await;
        let work = work.clone();
        let _ = tokio::task::spawn_blocking(move || work()).await;
    }
}

/// An interval whose late ticks wait for the work before them rather than
/// come in a burst after it.
fn ticking(period: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}
