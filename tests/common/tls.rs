//! A throwaway PKI made with the `openssl` command: a CA, a server
//! certificate for 127.0.0.1 and a client certificate, as PEM files.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl is needed by this test (Debian: apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// PEM files in a directory: `<name>.pem` and `<name>.key`.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    /// A CA named `ca`, a server certificate `server` and a client `client`.
    pub fn new(dir: &Path) -> Self {
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        pki.ca("ca");
        pki.issue(
            "ca",
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth",
        );
        pki.issue(
            "ca",
            "client",
            "subjectAltName=DNS:envoy\nextendedKeyUsage=clientAuth",
        );
        pki
    }

    /// A self-signed CA.
    pub fn ca(&self, name: &str) {
        let subject = format!("/CN={name}");
        openssl(
            &self.dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &subject,
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.pem"),
            ],
        );
    }

    /// A leaf certificate `name` signed by `ca`, with the extensions given.
    pub fn issue(&self, ca: &str, name: &str, extensions: &str) {
        let ext = self.dir.join(format!("{name}.ext"));
        std::fs::write(&ext, format!("{extensions}\nbasicConstraints=CA:FALSE\n")).expect("ext");
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.pem"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{name}.pem"),
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    }

    pub fn pem(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }

    pub fn path(&self, name: &str) -> String {
        self.pem(name).display().to_string()
    }

    /// `tollgate serve` arguments for mutual TLS with `server` and `ca`.
    pub fn mutual_tls_args(&self) -> [String; 6] {
        [
            "--tls-cert".into(),
            self.path("server"),
            "--tls-key".into(),
            self.key_path("server"),
            "--tls-client-ca".into(),
            self.path("ca"),
        ]
    }

    pub fn key_path(&self, name: &str) -> String {
        self.key(name).display().to_string()
    }
}

pub fn client_config(pki: &Pki, ca: &str, client: Option<&str>) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.pem(ca)).expect("ca") {
        roots.add(cert.expect("ca cert")).expect("root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = match client {
        Some(name) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(pki.pem(name))
                .expect("client cert")
                .map(|c| c.expect("cert"))
                .collect();
            let key = PrivateKeyDer::from_pem_file(pki.key(name)).expect("client key");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client auth")
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// One ShouldRateLimit call over TLS; `Err` when the connection or the
/// handshake fails.
pub async fn tls_call(
    addr: SocketAddr,
    config: rustls::ClientConfig,
) -> Result<RateLimitResponse, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from("127.0.0.1").expect("name");
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let message = super::request("t", &[&[("user", "ann")]]).encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(&message);
    let req = http::Request::post(format!(
        "https://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(Bytes::from(body)))
    .expect("request");
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if bytes.len() < 5 {
        return Err(format!("no message: {bytes:?}"));
    }
    RateLimitResponse::decode(&bytes[5..]).map_err(|e| e.to_string())
}
