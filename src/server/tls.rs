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
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio_rustls::TlsAcceptor;

/// Where the certificate, its key and (for mTLS) the client CA are.
#[derive(Debug, Clone)]
pub(crate) struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates that client certificates must chain to; `None`
    /// serves TLS without asking clients for a certificate.
    pub client_ca: Option<PathBuf>,
    /// A name (DNS name or IP address) a client certificate's SAN must
    /// carry, beyond chaining to `client_ca`.
    pub client_san: Option<String>,
}

/// The server's TLS configurations, one per protocol (ALPN), swapped
/// atomically on reload.
pub(crate) struct Tls {
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
    pub(crate) fn load(files: TlsFiles) -> Result<Self, String> {
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
    pub(crate) fn grpc_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.grpc.load_full())
    }

    /// For a new admin connection (ALPN `http/1.1`).
    pub(crate) fn admin_acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.admin.load_full())
    }

    /// Re-reads the files; when they changed and load, new connections use
    /// them. Returns whether the configuration was replaced. Reads files:
    /// call it off the async runtime.
    pub(crate) fn reload_if_changed(&self) -> bool {
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
                match &files.client_san {
                    None => builder.with_client_cert_verifier(verifier),
                    Some(san) => {
                        let name = ServerName::try_from(san.clone()).map_err(|_| {
                            format!("client SAN {san:?}: not a DNS name or an IP address")
                        })?;
                        builder.with_client_cert_verifier(Arc::new(RequireSan {
                            inner: verifier,
                            name,
                        }))
                    }
                }
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

/// A client certificate verifier that also wants a name in the
/// certificate's SAN (the reference's `GRPC_CLIENT_TLS_SAN`).
#[derive(Debug)]
struct RequireSan {
    inner: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl ClientCertVerifier for RequireSan {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        cert.verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
            })?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
