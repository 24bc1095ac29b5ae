//! An xDS management server for tests, written from the xDS protocol spec
//! (ADS, state of the world): what Envoy Gateway's xDS server is to the rate
//! limit service. It serves `RateLimitConfig` snapshots over mutual TLS (or
//! plaintext), sends the snapshot in force on every new stream and every
//! change to every open stream (each response with a fresh nonce), and
//! records every request (node, metadata, version, nonce, error) so tests
//! can check ACKs and NACKs.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use futures_util::{Stream, StreamExt};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;
use tollgate::test_util::{RateLimitConfig, TYPE_URL};

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub node_id: Option<String>,
    pub node_metadata: Vec<(String, String)>,
    /// The `x-token` gRPC metadata of the stream.
    pub token: Option<String>,
    pub type_url: String,
    pub version_info: String,
    pub response_nonce: String,
    pub error: Option<String>,
}

type Snapshot = Option<(String, Vec<RateLimitConfig>)>;

#[derive(Clone)]
struct Ads {
    snapshot: watch::Receiver<Snapshot>,
    seen: Arc<Mutex<Vec<Seen>>>,
    nonces: Arc<std::sync::atomic::AtomicU64>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;
type DeltaResponses =
    Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

fn response(version: &str, configs: &[RateLimitConfig], nonce: u64) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.into(),
        type_url: TYPE_URL.into(),
        nonce: format!("nonce-{nonce}"),
        resources: configs
            .iter()
            .map(|c| Any {
                type_url: TYPE_URL.into(),
                value: c.encode_to_vec(),
            })
            .collect(),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let token = request
            .metadata()
            .get("x-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut incoming = request.into_inner();
        let seen = self.seen.clone();
        // Record every request; the stream's first one says which type it
        // wants (answer only ours).
        let (first_tx, first_rx) = tokio::sync::oneshot::channel::<String>();
        tokio::spawn(async move {
            let mut first = Some(first_tx);
            while let Some(Ok(r)) = incoming.next().await {
                let node = r.node.clone();
                seen.lock().expect("seen").push(Seen {
                    node_id: node.as_ref().map(|n| n.id.clone()),
                    node_metadata: node
                        .and_then(|n| n.metadata)
                        .map(|m| {
                            m.fields
                                .into_iter()
                                .map(|(k, v)| {
                                    let v = match v.kind {
                                        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(s)) => s,
                                        other => format!("{other:?}"),
                                    };
                                    (k, v)
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    token: token.clone(),
                    type_url: r.type_url.clone(),
                    version_info: r.version_info.clone(),
                    response_nonce: r.response_nonce.clone(),
                    error: r.error_detail.map(|e| e.message),
                });
                if let Some(tx) = first.take() {
                    let _ = tx.send(r.type_url);
                }
            }
        });
        let mut snapshot = self.snapshot.clone();
        let nonces = self.nonces.clone();
        let out = async_stream(move |tx| async move {
            match first_rx.await {
                Ok(type_url) if type_url == TYPE_URL => {}
                _ => return,
            }
            loop {
                let current = snapshot.borrow_and_update().clone();
                if let Some((version, configs)) = current {
                    let nonce = nonces.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if tx
                        .send(Ok(response(&version, &configs, nonce)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                if snapshot.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(tonic::Response::new(out))
    }

    async fn delta_aggregated_resources(
        &self,
        _: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<DeltaResponses>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only"))
    }
}

/// A stream fed by a task that writes into a channel.
fn async_stream<F, Fut>(body: F) -> Responses
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<DiscoveryResponse, tonic::Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(body(tx));
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

/// TLS for the server: its certificate and the CA its clients' must chain to.
pub struct ServerTls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub client_ca: std::path::PathBuf,
}

/// A running xDS server; stops on drop.
pub struct XdsServer {
    pub addr: SocketAddr,
    snapshot: watch::Sender<Snapshot>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl XdsServer {
    /// Starts on `addr` (port 0 for a free one), over mutual TLS when `tls`.
    pub async fn start(addr: SocketAddr, tls: Option<&ServerTls>, snapshot: Snapshot) -> Self {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind xDS");
        let addr = listener.local_addr().expect("addr");
        let acceptor = tls.map(|t| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(&t.client_ca).expect("ca") {
                roots.add(cert.expect("cert")).expect("root");
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider.clone(),
            )
            .build()
            .expect("verifier");
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&t.cert)
                .expect("cert")
                .map(|c| c.expect("cert"))
                .collect();
            let key = PrivateKeyDer::from_pem_file(&t.key).expect("key");
            let mut config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)
                .expect("server config");
            config.alpn_protocols = vec![b"h2".to_vec()];
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        let (snapshot_tx, snapshot_rx) = watch::channel(snapshot);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ads = Ads {
            snapshot: snapshot_rx,
            seen: seen.clone(),
            nonces: Arc::default(),
        };
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let (tcp, _) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(_) => continue,
                    },
                    _ = &mut stop_rx => break,
                };
                let service =
                    TowerToHyperService::new(AggregatedDiscoveryServiceServer::new(ads.clone()));
                let acceptor = acceptor.clone();
                connections.spawn(async move {
                    let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(tcp).await {
                                let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                            }
                        }
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
                        }
                    }
                });
            }
            // Dropping the set aborts every connection: the server is gone.
            connections.abort_all();
        });
        XdsServer {
            addr,
            snapshot: snapshot_tx,
            seen,
            stop: Some(stop_tx),
        }
    }

    /// Makes `configs` the snapshot at `version`, sent to every stream.
    pub fn set(&self, version: &str, configs: Vec<RateLimitConfig>) {
        self.snapshot.send_replace(Some((version.into(), configs)));
    }

    /// Requests received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    /// Waits until a request matching `f` arrives (10 s at most).
    pub async fn wait_for(&self, what: &str, f: impl Fn(&Seen) -> bool) -> Seen {
        self.wait_for_within(what, Duration::from_secs(10), f).await
    }

    /// Waits until a request matching `f` arrives, `within` at most.
    pub async fn wait_for_within(
        &self,
        what: &str,
        within: Duration,
        f: impl Fn(&Seen) -> bool,
    ) -> Seen {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.seen().into_iter().find(|s| f(s)) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {within:?}: {:#?}",
                self.seen()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
