//! Rules over xDS: the reference's `CONFIG_TYPE=GRPC_XDS_SOTW`, which is how
//! Envoy Gateway delivers rate limit rules.
//!
//! One `envoy.service.discovery.v3.AggregatedDiscoveryService/
//! StreamAggregatedResources` stream, state of the world, for resources of
//! type [`resource::TYPE_URL`]. Each response carries every
//! `RateLimitConfig` in force; they are translated into rule files
//! (`xds:<name>`) and loaded like files, through the same validation and
//! rule tree. A set that loads replaces the rules in force and is ACKed
//! (version and nonce of the response); one that does not is NACKed with the
//! errors in `error_detail`, and the rules in force stay. Loads are counted
//! in the same metrics as file loads. Until the first set is applied the
//! instance is not ready, unless told to start without one (the reference's
//! `FORCE_START_WITHOUT_INITIAL_CONFIG`). A stream that cannot be opened is
//! retried every `connect_retry` (±50 %); one that fails after it was open
//! is reopened after an exponential backoff, reset by every applied
//! response. The reconnecting request carries the version in force, so the
//! server can tell what this instance has.

mod connect;
mod nack;
pub(crate) mod resource;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use envoy_types::pb::google::rpc::Status;
use prost::Message;
use rustls::pki_types::ServerName;
use tokio::sync::mpsc;

use connect::Connector;
pub(crate) use connect::XdsTls;

use crate::health::Health;
use crate::limiter::Limiter;
use crate::rules::{LoadOptions, load_sources};

/// The exponential backoff between streams that failed after opening.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
    /// Each wait is the nominal one times a factor drawn from
    /// `1 ± random_factor` (0: no randomness).
    pub random_factor: f64,
}

impl Backoff {
    /// The wait before attempt `n` (0-based) with `random` in [0, 1).
    pub(crate) fn wait(&self, attempt: u32, random: f64) -> Duration {
        let nominal = self
            .initial
            .saturating_mul(2u32.saturating_pow(attempt.min(30)))
            .min(self.max);
        let factor = 1.0 + self.random_factor * (2.0 * random - 1.0);
        nominal.mul_f64(factor.max(0.0))
    }
}

/// Where the rules come from and how to reach it.
#[derive(Debug, Clone)]
pub(crate) struct XdsOptions {
    /// `host:port` of the xDS server.
    pub addr: String,
    /// TLS to it (`None`: plaintext).
    pub tls: Option<XdsTls>,
    /// The node id the server keys its snapshots by.
    pub node_id: String,
    /// The node's metadata (string values).
    pub node_metadata: Vec<(String, String)>,
    /// gRPC metadata sent on the stream.
    pub headers: Vec<(String, String)>,
    /// Wait between attempts to open the stream.
    pub connect_retry: Duration,
    /// Wait after a stream that failed once open.
    pub backoff: Backoff,
    /// The largest response accepted, in bytes.
    pub max_message_bytes: usize,
    /// Ready before the first rules arrive (with none).
    pub ready_without_rules: bool,
    /// How rule texts are loaded.
    /// HTTP/2 keepalive PINGs this often on the connection.
    pub keepalive: Duration,
    /// How long a PING may go unanswered before the connection is dropped.
    pub keepalive_timeout: Duration,
    /// How long the server may take to answer the opening of a stream.
    pub open_timeout: Duration,
    pub load_options: LoadOptions,
}

/// A failed stream: whether it had been opened (the backoff applies) or not
/// (the connect retry applies).
struct Failed {
    opened: bool,
    reason: String,
}

/// What the instance holds: the version in force, for the next stream.
#[derive(Default)]
struct State {
    version: String,
    /// The NACKs sent, for their log lines.
    nacks: nack::Nacks,
}

/// Fetches rules from the xDS server for as long as the process runs.
pub(crate) async fn run(options: XdsOptions, limiter: Arc<Limiter>, health: Arc<Health>) {
    health.rules_from_server(
        &format!(
            "waiting for the first rules from the xDS server {}",
            options.addr
        ),
        options.ready_without_rules,
    );
    let connector = match connector(&options) {
        Ok(c) => c,
        Err(e) => {
            // Checked at start-up (see `check`); kept here as a backstop.
            tracing::error!(error = %e, "xDS client not started");
            return;
        }
    };
    let mut state = State::default();
    let mut attempt = 0;
    loop {
        let applied_before = state.version.clone();
        let failed = session(&options, &connector, &limiter, &health, &mut state).await;
        if state.version != applied_before {
            attempt = 0;
        }
        let wait = if failed.opened {
            let wait = options.backoff.wait(attempt, random());
            attempt = attempt.saturating_add(1);
            wait
        } else {
            options.connect_retry.mul_f64(0.5 + random())
        };
        tracing::warn!(
            server = %options.addr,
            reason = %failed.reason,
            retry_in = ?wait,
            "xDS stream for rate limit rules ended; the rules in force stay"
        );
        tokio::time::sleep(wait).await;
    }
}

/// Checks what can be checked before serving: the TLS files.
pub(crate) fn check(options: &XdsOptions) -> Result<(), String> {
    connector(options).map(|_| ())
}

fn connector(options: &XdsOptions) -> Result<Connector, String> {
    let tls = match &options.tls {
        None => None,
        Some(tls) => {
            let host = options
                .addr
                .rsplit_once(':')
                .map_or(options.addr.as_str(), |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = tls.server_name.as_deref().unwrap_or(host).to_owned();
            let name = ServerName::try_from(name.clone())
                .map_err(|e| format!("xDS server name {name:?}: {e}"))?;
            Some((tls.client_config()?, name))
        }
    };
    Ok(Connector {
        addr: options.addr.clone(),
        tls,
    })
}

/// A number in [0, 1) that differs between instances and calls.
fn random() -> f64 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()).rotate_left(32);
    (xxhash_rust::xxh3::xxh3_64(&seed.to_le_bytes()) >> 11) as f64 / (1u64 << 53) as f64
}

fn node(options: &XdsOptions) -> Node {
    let fields = options
        .node_metadata
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Value {
                    kind: Some(Kind::StringValue(v.clone())),
                },
            )
        })
        .collect();
    Node {
        id: options.node_id.clone(),
        user_agent_name: "tollgate".into(),
        metadata: Some(Struct { fields }),
        ..Default::default()
    }
}

/// One stream: open it, apply every response, ACK or NACK it. Returns why
/// it ended.
async fn session(
    options: &XdsOptions,
    connector: &Connector,
    limiter: &Arc<Limiter>,
    health: &Health,
    state: &mut State,
) -> Failed {
    let not_opened = |reason: String| Failed {
        opened: false,
        reason,
    };
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let endpoint =
        match tonic::transport::Endpoint::from_shared(format!("{scheme}://{}", options.addr)) {
            Ok(e) => e
                .connect_timeout(options.connect_retry.max(Duration::from_secs(1)))
                // A frozen path to the control plane is noticed: an
                // unanswered PING drops the connection, and it is made again.
                .http2_keep_alive_interval(options.keepalive)
                .keep_alive_timeout(options.keepalive_timeout)
                .keep_alive_while_idle(true),
            Err(e) => return not_opened(format!("bad xDS server address: {e}")),
        };
    let channel = match endpoint.connect_with_connector(connector.clone()).await {
        Ok(c) => c,
        Err(e) => return not_opened(format!("cannot connect: {}", chain(&e))),
    };
    let mut client = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(options.max_message_bytes);
    let (tx, rx) = mpsc::channel::<DiscoveryRequest>(4);
    let first = DiscoveryRequest {
        version_info: state.version.clone(),
        node: Some(node(options)),
        type_url: resource::TYPE_URL.into(),
        ..Default::default()
    };
    if tx.send(first).await.is_err() {
        return not_opened("request stream closed".into());
    }
    let requests =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let mut request = tonic::Request::new(requests);
    for (name, value) in &options.headers {
        let (Ok(name), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(name.as_bytes()),
            value.parse(),
        ) else {
            return not_opened(format!("header {name}: not a valid gRPC metadata entry"));
        };
        request.metadata_mut().insert(name, value);
    }
    // A server that accepts the connection and never answers is given up
    // on, logged, and tried again.
    let opened = tokio::time::timeout(
        options.open_timeout,
        client.stream_aggregated_resources(request),
    )
    .await;
    let mut responses = match opened {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(status)) => return not_opened(format!("stream refused: {status}")),
        Err(_) => {
            return not_opened(format!(
                "no answer within {:?} (--xds-open-timeout)",
                options.open_timeout
            ));
        }
    };
    tracing::info!(server = %options.addr, node = %options.node_id, "xDS stream for rate limit rules open");
    loop {
        let response = match responses.message().await {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Failed {
                    opened: true,
                    reason: "the server ended the stream".into(),
                };
            }
            Err(status) => {
                return Failed {
                    opened: true,
                    reason: format!("{status}"),
                };
            }
        };
        // Parsed and compiled on a blocking thread: a large push (megabytes
        // of rules) must not hold the runtime that answers the probes.
        let (response, applied) = {
            let (limiter, load_options) = (limiter.clone(), options.load_options);
            match tokio::task::spawn_blocking(move || {
                let applied = apply(&response, &load_options, &limiter);
                (response, applied)
            })
            .await
            {
                Ok(done) => done,
                Err(e) => {
                    return Failed {
                        opened: true,
                        reason: format!("applying the rules failed: {e}"),
                    };
                }
            }
        };
        let reply = match applied {
            Ok(domains) => {
                state.version = response.version_info.clone();
                health.rules_applied(&response.version_info);
                tracing::info!(
                    version = %response.version_info,
                    resources = response.resources.len(),
                    domains,
                    "rules from xDS applied"
                );
                DiscoveryRequest {
                    version_info: response.version_info.clone(),
                    response_nonce: response.nonce.clone(),
                    type_url: resource::TYPE_URL.into(),
                    ..Default::default()
                }
            }
            Err(errors) => {
                let errors = state.nacks.refused(&errors, &response.version_info);
                DiscoveryRequest {
                    version_info: state.version.clone(),
                    response_nonce: response.nonce.clone(),
                    type_url: resource::TYPE_URL.into(),
                    error_detail: Some(Status {
                        code: tonic::Code::InvalidArgument as i32,
                        message: errors,
                        details: Vec::new(),
                    }),
                    ..Default::default()
                }
            }
        };
        if tx.send(reply).await.is_err() {
            return Failed {
                opened: true,
                reason: "request stream closed".into(),
            };
        }
    }
}

/// The error and its sources, for a log line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Loads a response's resources as the rules in force. Returns the number
/// of domains, or every error (the rules in force then stay).
fn apply(
    response: &DiscoveryResponse,
    options: &LoadOptions,
    limiter: &Limiter,
) -> Result<usize, String> {
    let result = sources(response)
        .and_then(|sources| load_sources(&sources, options).map_err(|errors| errors.to_string()));
    match result {
        Ok(rules) => {
            let domains = rules.domain_count();
            limiter.set_rules(rules);
            Ok(domains)
        }
        Err(e) => {
            limiter.count_load(false);
            Err(e)
        }
    }
}

/// The rule texts of a response, named `xds:<resource name>`.
fn sources(response: &DiscoveryResponse) -> Result<Vec<(PathBuf, String)>, String> {
    if response.type_url != resource::TYPE_URL {
        return Err(format!(
            "resources of type {:?}, expected {}",
            response.type_url,
            resource::TYPE_URL
        ));
    }
    let mut names = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(response.resources.len());
    for (i, any) in response.resources.iter().enumerate() {
        if any.type_url != resource::TYPE_URL {
            return Err(format!(
                "resource {i}: type {:?}, expected {}",
                any.type_url,
                resource::TYPE_URL
            ));
        }
        let config = resource::RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("resource {i}: not a RateLimitConfig: {e}"))?;
        let name = if config.name.is_empty() {
            format!("#{i}")
        } else {
            config.name.clone()
        };
        if !names.insert(name.clone()) {
            return Err(format!("two resources named {name:?}"));
        }
        out.push((
            PathBuf::from(format!("xds:{name}")),
            resource::to_rule_text(&config),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_maximum_within_its_random_factor() {
        let b = Backoff {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            random_factor: 0.5,
        };
        assert_eq!(b.wait(0, 0.5), Duration::from_secs(10));
        assert_eq!(b.wait(1, 0.5), Duration::from_secs(20));
        assert_eq!(b.wait(3, 0.5), Duration::from_secs(60));
        assert_eq!(b.wait(u32::MAX, 0.5), Duration::from_secs(60));
        assert_eq!(b.wait(0, 0.0), Duration::from_secs(5));
        assert!(b.wait(0, 0.999_999) < Duration::from_secs(15));
        let none = Backoff {
            random_factor: 0.0,
            ..b
        };
        assert_eq!(none.wait(1, 0.9), Duration::from_secs(20));
    }

    #[test]
    fn a_response_of_another_type_or_with_garbage_is_refused_naming_it() {
        let wrong = DiscoveryResponse {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            ..Default::default()
        };
        assert!(sources(&wrong).expect_err("refused").contains("Cluster"));
        let garbage = DiscoveryResponse {
            type_url: resource::TYPE_URL.into(),
            resources: vec![envoy_types::pb::google::protobuf::Any {
                type_url: resource::TYPE_URL.into(),
                value: vec![0x0a, 0xff],
            }],
            ..Default::default()
        };
        assert!(
            sources(&garbage)
                .expect_err("refused")
                .contains("resource 0")
        );
    }
}
