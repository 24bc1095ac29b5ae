//! A throwaway PKI made with the `openssl` command: a CA, a server
//! certificate for 127.0.0.1 and a client certificate, as PEM files.

use std::path::{Path, PathBuf};
use std::process::Command;

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
