//! The reference's xDS variables: `CONFIG_TYPE=GRPC_XDS_SOTW` with its
//! `CONFIG_GRPC_XDS_*`, `XDS_CLIENT_*` and `FORCE_START_WITHOUT_INITIAL_CONFIG`.

use std::path::PathBuf;

use super::reference_env::{adopt, bool_var, set_var};
use super::{OnOff, ServeArgs};

impl ServeArgs {
    /// Rules over xDS from the reference's `CONFIG_TYPE=GRPC_XDS_SOTW` and
    /// its `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` variables. Returns whether
    /// rules come from xDS.
    pub(super) fn apply_reference_xds(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
        explicit: &dyn Fn(&str) -> bool,
    ) -> Result<bool, String> {
        let set = |name: &str| set_var(env, name);
        match set("CONFIG_TYPE")
            .map(|t| t.to_ascii_uppercase())
            .as_deref()
        {
            None | Some("FILE") => return Ok(false),
            Some("GRPC_XDS_SOTW") => {}
            Some(other) => {
                return Err(format!(
                    "CONFIG_TYPE={other}: expected FILE or GRPC_XDS_SOTW"
                ));
            }
        }
        if explicit("rules") {
            return Err("CONFIG_TYPE=GRPC_XDS_SOTW (envoyproxy/ratelimit's setting) contradicts --rules; set one of them".into());
        }
        let boolean = |name: &str| bool_var(env, name);
        let duration = |name: &str| -> Result<Option<std::time::Duration>, String> {
            set(name)
                .map(|v| super::parse_duration(&v).map_err(|e| format!("{name}={v}: {e}")))
                .transpose()
        };
        let x = &mut self.xds;
        let tls = boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS")?.unwrap_or(false);
        let server = set("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or_else(|| "localhost:18000".into());
        let url = format!("{}://{server}", if tls { "https" } else { "http" });
        adopt(
            &mut x.rules_xds,
            Some(url),
            explicit("rules_xds"),
            "rules-xds",
            "CONFIG_GRPC_XDS_SERVER_URL",
        )?;
        if let Some(id) = set("CONFIG_GRPC_XDS_NODE_ID") {
            adopt(
                &mut x.xds_node_id,
                id,
                explicit("xds_node_id"),
                "xds-node-id",
                "CONFIG_GRPC_XDS_NODE_ID",
            )?;
        }
        // "key1=val1,key2=val2"; entries without '=' are skipped, as the
        // reference does.
        if let Some(metadata) = set("CONFIG_GRPC_XDS_NODE_METADATA") {
            let pairs = metadata
                .split(',')
                .filter_map(|e| e.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect();
            adopt(
                &mut x.xds_node_metadata,
                pairs,
                explicit("xds_node_metadata"),
                "xds-node-metadata",
                "CONFIG_GRPC_XDS_NODE_METADATA",
            )?;
        }
        // envconfig's map form: "key1:val1,key2:val2".
        if let Some(headers) = set("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS") {
            let mut pairs = Vec::new();
            for entry in headers.split(',') {
                let (k, v) = entry.split_once(':').ok_or_else(|| {
                    format!("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: '{entry}' is not key:value")
                })?;
                pairs.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
            adopt(
                &mut x.xds_headers,
                pairs,
                explicit("xds_headers"),
                "xds-header",
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            )?;
        }
        let files = [
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "xds_ca"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "xds_client_cert"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds_client_key"),
        ];
        for (name, id) in files {
            let Some(path) = set(name) else { continue };
            if !tls {
                return Err(format!(
                    "{name} is set but CONFIG_GRPC_XDS_SERVER_USE_TLS is not true"
                ));
            }
            let field = match id {
                "xds_ca" => &mut x.xds_ca,
                "xds_client_cert" => &mut x.xds_client_cert,
                _ => &mut x.xds_client_key,
            };
            adopt(
                field,
                Some(PathBuf::from(path)),
                explicit(id),
                &id.replace('_', "-"),
                name,
            )?;
        }
        if let Some(san) = set("CONFIG_GRPC_XDS_SERVER_TLS_SAN") {
            adopt(
                &mut x.xds_server_name,
                Some(san),
                explicit("xds_server_name"),
                "xds-server-name",
                "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
            )?;
        }
        if let Some(d) = duration("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")? {
            adopt(
                &mut x.xds_connect_retry,
                d,
                explicit("xds_connect_retry"),
                "xds-connect-retry",
                "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            )?;
        }
        if let Some(d) = duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")? {
            adopt(
                &mut x.xds_backoff_initial,
                d,
                explicit("xds_backoff_initial"),
                "xds-backoff-initial",
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            )?;
        }
        if let Some(d) = duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL")? {
            adopt(
                &mut x.xds_backoff_max,
                d,
                explicit("xds_backoff_max"),
                "xds-backoff-max",
                "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
            )?;
        }
        let jitter = boolean("XDS_CLIENT_BACKOFF_JITTER")?.unwrap_or(true);
        let factor = match set("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
            Some(f) => Some(
                f.parse::<f64>()
                    .ok()
                    .filter(|f| (0.0..=1.0).contains(f))
                    .ok_or_else(|| {
                        format!(
                            "XDS_CLIENT_BACKOFF_RANDOM_FACTOR={f}: expected a number from 0 to 1"
                        )
                    })?,
            ),
            None => None,
        };
        if !jitter || factor.is_some() {
            let value = if jitter { factor.unwrap_or(0.5) } else { 0.0 };
            adopt(
                &mut x.xds_backoff_random_factor,
                value,
                explicit("xds_backoff_random_factor"),
                "xds-backoff-random-factor",
                "XDS_CLIENT_BACKOFF_RANDOM_FACTOR/JITTER",
            )?;
        }
        if let Some(size) = set("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") {
            let bytes: usize = size
                .parse()
                .map_err(|_| format!("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES={size}: not a number"))?;
            if bytes > 0 {
                adopt(
                    &mut x.xds_max_message_bytes,
                    bytes,
                    explicit("xds_max_message_bytes"),
                    "xds-max-message-bytes",
                    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
                )?;
            }
        }
        if let Some(force) = boolean("FORCE_START_WITHOUT_INITIAL_CONFIG")? {
            let wait = if force { OnOff::Off } else { OnOff::On };
            adopt(
                &mut x.xds_wait_for_rules,
                wait,
                explicit("xds_wait_for_rules"),
                "xds-wait-for-rules",
                "FORCE_START_WITHOUT_INITIAL_CONFIG",
            )?;
        }
        Ok(true)
    }
}
