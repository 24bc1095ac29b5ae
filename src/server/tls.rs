//! TLS for the gRPC and admin listeners, from PEM files, with optional
//! client certificate verification (mTLS). The files are re-read when they
//! change (a certificate renewed by cert-manager, say): new connections get
//! the new certificate, open ones keep theirs. A change that does not load
//! (a key that does not match, a half-written file) keeps the certificate in
//! force and is logged.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// Where the certificate, its key and (for mTLS) the client CA are.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates that client certificates must chain to; `None`
    /// serves TLS without asking clients for a certificate.
    pub client_ca: Option<PathBuf>,
}

/// The server's TLS configurations, one per protocol (ALPN), swapped
/// atomically on reload.
pub struct Tls {
    files: TlsFiles,
    grpc: ArcSwap<ServerConfig>,
    admin: ArcSwap<ServerConfig>,
    /// The files' contents when last loaded (or refused).
    seen: Mutex<Vec<u8>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Loads the files; the error names the file and the problem.
    pub fn load(files: TlsFiles) -> Result<Self, String> {
        let contents = read_all(&files)?;
        let (grpc, admin) = configs(&files, &contents)?;
        Ok(Self {
            files,
            grpc: ArcSwap::from_pointee(grpc),
            admin: ArcSwap::from_pointee(admin),
            seen: Mutex::new(contents.concat()),
        })
    }

    /// For a new gRPC connection (ALPN `h2`).
    pub fn grpc_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.grpc.load_full())
    }

    /// For a new admin connection (ALPN `http/1.1`).
    pub fn admin_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.admin.load_full())
    }

    /// Re-reads the files; when they changed and load, new connections use
    /// them. Returns whether the configuration was replaced. Reads files:
    /// call it off the async runtime.
    pub fn reload_if_changed(&self) -> bool {
        let contents = match read_all(&self.files) {
            Ok(c) => c,
            Err(e) => {
                let mut seen = self.seen.lock();
                if !seen.is_empty() {
                    tracing::error!(error = %e, "TLS files not reloaded; the certificate in force stays");
                    seen.clear();
                }
                return false;
            }
        };
        let joined = contents.concat();
        {
            let mut seen = self.seen.lock();
            if *seen == joined {
                return false;
            }
            *seen = joined;
        }
        match configs(&self.files, &contents) {
            Ok((grpc, admin)) => {
                self.grpc.store(Arc::new(grpc));
                self.admin.store(Arc::new(admin));
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS files not reloaded; the certificate in force stays");
                false
            }
        }
    }
}

fn read_all(files: &TlsFiles) -> Result<Vec<Vec<u8>>, String> {
    let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut out = vec![read(&files.cert)?, read(&files.key)?];
    if let Some(ca) = &files.client_ca {
        out.push(read(ca)?);
    }
    Ok(out)
}

fn configs(files: &TlsFiles, contents: &[Vec<u8>]) -> Result<(ServerConfig, ServerConfig), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&contents[0])
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", files.cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no certificate in the file",
            files.cert.display()
        ));
    }
    let build = |alpn: &[u8]| -> Result<ServerConfig, String> {
        let key = PrivateKeyDer::from_pem_slice(&contents[1])
            .map_err(|e| format!("{}: not a PEM private key: {e}", files.key.display()))?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match (&files.client_ca, contents.get(2)) {
            (Some(ca_path), Some(ca)) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca) {
                    let cert = cert.map_err(|e| {
                        format!("{}: not a PEM certificate: {e}", ca_path.display())
                    })?;
                    roots
                        .add(cert)
                        .map_err(|e| format!("{}: {e}", ca_path.display()))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider.clone(),
                )
                .build()
                .map_err(|e| format!("{}: {e}", ca_path.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(certs.clone(), key)
            .map_err(|e| format!("{} and {}: {e}", files.cert.display(), files.key.display()))?;
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(config)
    };
    Ok((build(b"h2")?, build(b"http/1.1")?))
}
