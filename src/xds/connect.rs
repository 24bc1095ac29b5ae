//! The connection to the xDS server: TCP, then TLS when asked (a private
//! CA, a client certificate for mTLS, the name to verify), under tonic's
//! HTTP/2 channel.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};

/// TLS to the xDS server.
#[derive(Debug, Clone, Default)]
pub(crate) struct XdsTls {
    /// PEM CAs the server's certificate must chain to (`None`: the system's).
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain and key, for mutual TLS.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// The name the server's certificate must carry (`None`: the host).
    pub server_name: Option<String>,
}

impl XdsTls {
    /// The client configuration; the error names the file and the problem.
    pub(super) fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some(path) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .map_err(|e| format!("xDS CA {}: {e}", path.display()))?;
                for cert in certs {
                    let cert = cert.map_err(|e| format!("xDS CA {}: {e}", path.display()))?;
                    roots
                        .add(cert)
                        .map_err(|e| format!("xDS CA {}: {e}", path.display()))?;
                }
                if roots.is_empty() {
                    return Err(format!("xDS CA {}: no certificate in it", path.display()));
                }
            }
            None => {
                let native = rustls_native_certs::load_native_certs();
                for cert in native.certs {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(
                        "TLS to the xDS server: no system CA certificates; give the CA file".into(),
                    );
                }
            }
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let mut config = match &self.client_cert {
            Some((cert, key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
                    .map_err(|e| format!("xDS client certificate {}: {e}", cert.display()))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("xDS client certificate {}: {e}", cert.display()))?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("xDS client key {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("xDS client certificate and key: {e}"))?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A connection of either kind.
pub(super) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Connects to one address, with TLS when configured. Used as tonic's
/// connector, so the channel's URI only names the scheme and authority.
#[derive(Clone)]
pub(super) struct Connector {
    pub(super) addr: String,
    pub(super) tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
}

type Connecting =
    Pin<Box<dyn Future<Output = Result<TokioIo<Box<dyn Io>>, std::io::Error>> + Send>>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Box<dyn Io>>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = tokio::net::TcpStream::connect(&this.addr).await?;
            let _ = tcp.set_nodelay(true);
            let io: Box<dyn Io> = match this.tls {
                None => Box::new(tcp),
                Some((config, name)) => {
                    let tls = tokio_rustls::TlsConnector::from(config)
                        .connect(name, tcp)
                        .await?;
                    Box::new(tls)
                }
            };
            Ok(TokioIo::new(io))
        })
    }
}
