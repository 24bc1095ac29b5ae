//! Tollgate served inside the test's own process and runtime, for tests
//! that drive time by hand: on a current-thread runtime started with its
//! clock paused, every timer of the server (handshake, idle, request and
//! admin timeouts, the accept back-off) runs on that clock, so a test of
//! an hour's idle timeout takes milliseconds and cannot be late.
//!
//! Any store; a test on a Redis store keeps the clock running (a paused
//! clock would race a real Redis's answers) and runs on a current-thread
//! runtime, as each of the binary's workers does (the Redis store's
//! connections and batching queues are per thread).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::limiter::Limiter;
use crate::settings::{Command, Env, load};

/// A running in-process Tollgate; stopped (and awaited) by [`InProcess::stop`].
#[derive(Debug)]
pub struct InProcess {
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The admin HTTP address (the first, with several `--admin-addr`).
    pub admin: SocketAddr,
    /// Every admin HTTP address.
    pub admins: Vec<SocketAddr>,
    limiter: Arc<Limiter>,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<std::io::Result<()>>,
}

impl InProcess {
    /// Serves `tollgate serve ARGS` on the current runtime, with one worker
    /// and both listeners on free loopback ports unless `args` say
    /// otherwise, and no environment variable. The error is start-up's, as
    /// the binary would print it.
    pub fn start(args: &[&str]) -> Result<Self, String> {
        Self::start_with_env(args, &[])
    }

    /// [`InProcess::start`] with these environment variables, read as the
    /// binary reads the process's (`settings::load`): `TOLLGATE_*`, the
    /// reference's, an unknown one refused.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Result<Self, String> {
        let mut argv = vec!["tollgate", "serve"];
        for (flag, default) in [
            ("--grpc-addr", "127.0.0.1:0"),
            ("--admin-addr", "127.0.0.1:0"),
            ("--workers", "1"),
        ] {
            if !args.contains(&flag) {
                argv.extend([flag, default]);
            }
        }
        argv.extend_from_slice(args);
        let cli = load(argv, &Env::from_pairs(env.iter().copied())).map_err(|e| e.to_string())?;
        let Command::Serve(serve_args) = cli.command else {
            return Err("not a serve command".into());
        };
        let (serve, _otel) = super::start::prepare(&serve_args)?;
        let addresses = |listeners: &[std::net::TcpListener]| -> Vec<SocketAddr> {
            listeners
                .iter()
                .filter_map(|l| l.local_addr().ok())
                .collect()
        };
        let admins = addresses(&serve.admin);
        let (Some(&grpc), Some(&admin)) = (addresses(&serve.grpc).first(), admins.first()) else {
            return Err("no gRPC or no admin listener".into());
        };
        let limiter = serve.limiter.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = tokio::spawn(super::run_here(serve, async move {
            let _ = stopped.await;
        }));
        Ok(Self {
            grpc,
            admin,
            admins,
            limiter,
            stop: Some(stop),
            served,
        })
    }

    /// A counter or gauge of the limiter's families, by its name with its
    /// labels as `/metrics` writes them (`None` when absent), read without
    /// a connection: the admin port's connections are what some tests count.
    pub fn metric(&self, series: &str) -> Option<u64> {
        let text = self.limiter.metrics().render();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Shuts down as on SIGTERM (health fails, listeners close, calls in
    /// flight finish) and waits for it.
    pub async fn stop(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.served)
            .await
            .map_err(|_| std::io::Error::other("the server task panicked"))?
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.served.abort();
    }
}
