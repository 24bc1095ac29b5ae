//! Envoy Gateway's rate limit Deployment, as the tests stand it up: its
//! `envoy-rate-limit` certificate, an xDS server that requires it, and the
//! environment Envoy Gateway gives `/bin/ratelimit` (its
//! `internal/infrastructure/kubernetes/ratelimit/testdata/deployments/default.yaml`,
//! in its order), with hosts, ports and paths moved to the test's.

use std::net::SocketAddr;
use std::path::Path;

use super::redis::free_port;
use super::tls::Pki;
use super::xds::{ServerTls, XdsServer};

/// The certificates and the xDS server of one Deployment.
pub struct Gateway {
    pub pki: Pki,
    pub xds: XdsServer,
}

impl Gateway {
    /// Issues the `ratelimit` certificate (gRPC server, and client to the
    /// xDS server) under CA `ca` in `dir`, and starts an xDS server that
    /// asks for it.
    pub async fn start(dir: &Path) -> Self {
        let pki = Pki::new(dir);
        pki.issue(
            "ca",
            "ratelimit",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth",
        );
        let tls = ServerTls {
            cert: pki.pem("server"),
            key: pki.key("server"),
            client_ca: pki.pem("ca"),
        };
        let xds = XdsServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), Some(&tls), None).await;
        Gateway { pki, xds }
    }
}

/// Where the Deployment's files are (`/certs/...` in the pod) and where
/// its listeners go.
pub struct Deployment {
    pub runtime_root: String,
    pub cert: String,
    pub key: String,
    pub ca: String,
    pub xds_url: String,
    pub redis_url: String,
    pub grpc_port: u16,
    pub http_port: u16,
    pub debug_port: u16,
}

impl Deployment {
    /// On free ports, with the files at `cert`, `key` and `ca`.
    pub fn new(gateway: &Gateway, redis_url: String, files: [String; 3], root: String) -> Self {
        let [cert, key, ca] = files;
        Deployment {
            runtime_root: root,
            cert,
            key,
            ca,
            xds_url: gateway.xds.addr.to_string(),
            redis_url,
            grpc_port: free_port(),
            http_port: free_port(),
            debug_port: free_port(),
        }
    }

    /// The environment, without the stats variables (`USE_PROMETHEUS`,
    /// `PROMETHEUS_*`), which each test adds.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let s = |v: &str| v.to_owned();
        vec![
            ("RUNTIME_ROOT", s(&self.runtime_root)),
            ("RUNTIME_SUBDIRECTORY", s("ratelimit")),
            ("RUNTIME_IGNOREDOTFILES", s("true")),
            ("RUNTIME_WATCH_ROOT", s("false")),
            ("LOG_LEVEL", s("info")),
            ("USE_STATSD", s("false")),
            ("CONFIG_TYPE", s("GRPC_XDS_SOTW")),
            ("CONFIG_GRPC_XDS_SERVER_URL", s(&self.xds_url)),
            ("CONFIG_GRPC_XDS_NODE_ID", s("envoy-ratelimit")),
            ("GRPC_SERVER_USE_TLS", s("true")),
            ("GRPC_SERVER_TLS_CERT", s(&self.cert)),
            ("GRPC_SERVER_TLS_KEY", s(&self.key)),
            ("GRPC_SERVER_TLS_CA_CERT", s(&self.ca)),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", s("true")),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", s(&self.cert)),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", s(&self.key)),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", s(&self.ca)),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", s("true")),
            ("REDIS_SOCKET_TYPE", s("tcp")),
            ("REDIS_URL", s(&self.redis_url)),
            // The reference's ports, moved to free ones (the kubelet
            // probes /healthcheck on PORT).
            ("GRPC_HOST", s("127.0.0.1")),
            ("GRPC_PORT", self.grpc_port.to_string()),
            ("HOST", s("127.0.0.1")),
            ("PORT", self.http_port.to_string()),
            ("DEBUG_HOST", s("127.0.0.1")),
            ("DEBUG_PORT", self.debug_port.to_string()),
        ]
    }
}

/// `env` as the `(&str, &str)` pairs the starters take.
pub fn borrowed<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}
