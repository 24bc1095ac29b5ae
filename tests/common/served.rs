//! Tollgate served inside the test's own process and runtime.

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use super::{client_of, envoy, rules_file, sample};

/// Tollgate served inside the test's own process and runtime (any store;
/// see `tollgate::test_util::InProcess`): for tests about what it
/// answers rather than about the process (signals, argv0, environment,
/// logs). The same surface as [`Tollgate`] where the two meet; blocking HTTP
/// calls go through [`Served::http`], off the runtime the server runs on.
pub struct Served {
    pub server: tollgate::test_util::InProcess,
    pub addr: SocketAddr,
    /// Admin HTTP.
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
}

impl Served {
    /// Serves `rules` (YAML text) with extra arguments, on the current
    /// runtime (with a paused clock, every timer of the server on it).
    pub fn start(rules: &str, args: &[&str]) -> Self {
        let (dir, rules) = rules_file(rules, args);
        let rules_arg: Vec<&str> = rules.iter().flat_map(|p| ["--rules", p]).collect();
        let args = [&rules_arg[..], args].concat();
        let server = tollgate::test_util::InProcess::start(&args).expect("starts");
        Served {
            addr: server.grpc,
            admin: server.admin,
            server,
            dir,
        }
    }

    /// Serves `rules` on the Redis at `url` (`redis://...`), then `args`.
    pub fn on_redis(rules: &str, url: &str, args: &[&str]) -> Self {
        Self::start(
            rules,
            &[&["--store", "redis", "--redis-url", url], args].concat(),
        )
    }

    /// Serves `rules` on the Redis Cluster of `urls` (comma-separated),
    /// then `args`.
    pub fn on_cluster(rules: &str, urls: &str, args: &[&str]) -> Self {
        Self::start(
            rules,
            &[&["--store", "redis-cluster", "--redis-url", urls], args].concat(),
        )
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        client_of(self.addr).await
    }

    /// An HTTP/1.1 call to the admin port, made on a blocking thread so the
    /// server keeps running on this one.
    pub async fn http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> envoy::Response {
        let (admin, method, path, body) = (
            self.admin,
            method.to_owned(),
            path.to_owned(),
            body.to_owned(),
        );
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        tokio::task::spawn_blocking(move || {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            envoy::http_with_body(admin, &method, &path, &headers, &body)
        })
        .await
        .expect("the call's thread")
        .expect("an answer")
    }

    /// The admin port's `/metrics`.
    pub async fn metrics(&self) -> String {
        self.http("GET", "/metrics", &[], "").await.body
    }

    /// The rule file the server was started on.
    pub fn rules_path(&self) -> std::path::PathBuf {
        self.dir.path().join("rules.yaml")
    }

    /// One sample of the admin port's `/metrics` (see [`sample`]); fails
    /// the test when it is absent.
    pub async fn metric(&self, series: &str) -> u64 {
        let body = self.metrics().await;
        sample(&body, series).unwrap_or_else(|| panic!("{series} not in /metrics:\n{body}")) as u64
    }
}
