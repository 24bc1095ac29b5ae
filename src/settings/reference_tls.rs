//! gRPC TLS from the reference's `GRPC_SERVER_*` variables.

use std::path::PathBuf;

use super::reference_env::adopt;
use super::{OnOff, ServeArgs};

impl ServeArgs {
    /// gRPC TLS from the reference's `GRPC_SERVER_USE_TLS`,
    /// `GRPC_SERVER_TLS_CERT`, `GRPC_SERVER_TLS_KEY` and
    /// `GRPC_CLIENT_TLS_CACERT` (client certificates required when set).
    pub(super) fn apply_reference_tls(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        explicit: &dyn Fn(&str) -> bool,
    ) -> Result<(), String> {
        let on = match env("GRPC_SERVER_USE_TLS")
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("" | "false" | "0" | "no") => false,
            Some("true" | "1" | "yes") => true,
            Some(other) => {
                return Err(format!(
                    "GRPC_SERVER_USE_TLS={other}: expected true or false"
                ));
            }
        };
        let file = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        let (cert, key, ca) = (
            file("GRPC_SERVER_TLS_CERT"),
            file("GRPC_SERVER_TLS_KEY"),
            file("GRPC_CLIENT_TLS_CACERT"),
        );
        if !on {
            if let Some(name) = [
                ("GRPC_SERVER_TLS_CERT", &cert),
                ("GRPC_SERVER_TLS_KEY", &key),
                ("GRPC_CLIENT_TLS_CACERT", &ca),
            ]
            .iter()
            .find_map(|(name, v)| v.is_some().then_some(name))
            {
                return Err(format!(
                    "{name} is set but GRPC_SERVER_USE_TLS is not true: the server would be plaintext"
                ));
            }
            return Ok(());
        }
        let (Some(cert), Some(key)) = (cert, key) else {
            return Err(
                "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"
                    .into(),
            );
        };
        adopt(
            &mut self.tls_cert,
            Some(cert),
            explicit("tls_cert"),
            "tls-cert",
            "GRPC_SERVER_TLS_CERT",
        )?;
        adopt(
            &mut self.tls_key,
            Some(key),
            explicit("tls_key"),
            "tls-key",
            "GRPC_SERVER_TLS_KEY",
        )?;
        // The reference's TLS is for gRPC only: its HTTP port (health
        // probes) stays plain.
        let explicit_admin = explicit("admin_tls");
        adopt(
            &mut self.admin_tls,
            OnOff::Off,
            explicit_admin,
            "admin-tls",
            "GRPC_SERVER_USE_TLS",
        )?;
        let san = file("GRPC_CLIENT_TLS_SAN").map(|p| p.display().to_string());
        if san.is_some() && ca.is_none() {
            return Err(
                "GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT (client certificates)".into(),
            );
        }
        if san.is_some() {
            adopt(
                &mut self.tls_client_san,
                san,
                explicit("tls_client_san"),
                "tls-client-san",
                "GRPC_CLIENT_TLS_SAN",
            )?;
        }
        if ca.is_some() {
            adopt(
                &mut self.tls_client_ca,
                ca,
                explicit("tls_client_ca"),
                "tls-client-ca",
                "GRPC_CLIENT_TLS_CACERT",
            )?;
        }
        Ok(())
    }
}
