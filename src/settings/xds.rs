//! `tollgate serve`'s flags for rules over xDS (see [`crate::xds`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{OnOff, at_least_one, parse_duration, parse_fraction};
use crate::rules::LoadOptions;
use crate::xds::{Backoff, XdsOptions, XdsTls};

/// Rules from an xDS server instead of rule files.
#[derive(Debug, Args, Clone)]
pub(crate) struct XdsArgs {
    /// Take the rules from this xDS server (`host:port`, or
    /// `https://host:port` for TLS) over ADS, state of the world, instead
    /// of rule files (what Envoy Gateway does).
    #[arg(long, env = "TOLLGATE_RULES_XDS", conflicts_with = "rules")]
    pub rules_xds: Option<String>,

    /// The node id the xDS server keys its snapshots by.
    #[arg(long, env = "TOLLGATE_XDS_NODE_ID", default_value = "default")]
    pub xds_node_id: String,

    /// The node's metadata, `key=value,...`.
    #[arg(long, env = "TOLLGATE_XDS_NODE_METADATA", value_delimiter = ',', value_parser = parse_pair)]
    pub xds_node_metadata: Vec<(String, String)>,

    /// gRPC metadata sent with the stream, `name=value,...`.
    #[arg(long = "xds-header", env = "TOLLGATE_XDS_HEADERS", value_delimiter = ',', value_parser = parse_pair)]
    pub xds_headers: Vec<(String, String)>,

    /// PEM CAs the xDS server's certificate must chain to (default: the system's).
    #[arg(long, env = "TOLLGATE_XDS_CA")]
    pub xds_ca: Option<PathBuf>,

    /// PEM client certificate for mutual TLS to the xDS server.
    #[arg(long, env = "TOLLGATE_XDS_CLIENT_CERT", requires = "xds_client_key")]
    pub xds_client_cert: Option<PathBuf>,

    /// Its PEM private key.
    #[arg(long, env = "TOLLGATE_XDS_CLIENT_KEY", requires = "xds_client_cert")]
    pub xds_client_key: Option<PathBuf>,

    /// The name the xDS server's certificate must carry (default: its host).
    #[arg(long, env = "TOLLGATE_XDS_SERVER_NAME")]
    pub xds_server_name: Option<String>,

    /// Wait between attempts to connect to the xDS server.
    #[arg(long, env = "TOLLGATE_XDS_CONNECT_RETRY", default_value = "3s", value_parser = parse_duration)]
    pub xds_connect_retry: Duration,

    /// First wait before reopening a stream that failed once open.
    #[arg(long, env = "TOLLGATE_XDS_BACKOFF_INITIAL", default_value = "10s", value_parser = parse_duration)]
    pub xds_backoff_initial: Duration,

    /// Longest wait before reopening a stream.
    #[arg(long, env = "TOLLGATE_XDS_BACKOFF_MAX", default_value = "60s", value_parser = parse_duration)]
    pub xds_backoff_max: Duration,

    /// Each backoff wait is randomised by ± this fraction (0 to 1).
    #[arg(long, env = "TOLLGATE_XDS_BACKOFF_RANDOM_FACTOR", default_value_t = 0.5, value_parser = parse_fraction)]
    pub xds_backoff_random_factor: f64,

    /// The largest xDS response accepted, in bytes.
    #[arg(long, env = "TOLLGATE_XDS_MAX_MESSAGE_BYTES", default_value_t = 4 << 20, value_parser = at_least_one)]
    pub xds_max_message_bytes: usize,

    /// Not ready until the first rules from xDS are in force (`off`: ready
    /// at once, with no rules).
    #[arg(long, env = "TOLLGATE_XDS_WAIT_FOR_RULES", value_enum, default_value_t = OnOff::On)]
    pub xds_wait_for_rules: OnOff,

    /// HTTP/2 keepalive on the xDS connection: a PING this often, and the
    /// connection dropped (then made again) when one is not answered within
    /// --xds-keepalive-timeout: a control plane whose network path froze is
    /// noticed.
    #[arg(long, env = "TOLLGATE_XDS_KEEPALIVE", default_value = "30s", value_parser = parse_duration)]
    pub xds_keepalive: Duration,

    /// How long a keepalive PING may go unanswered.
    #[arg(long, env = "TOLLGATE_XDS_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub xds_keepalive_timeout: Duration,

    /// The longest the xDS server may take to answer the opening of a
    /// stream; past it the attempt is logged and made again.
    #[arg(long, env = "TOLLGATE_XDS_OPEN_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub xds_open_timeout: Duration,
}

/// `key=value`.
fn parse_pair(text: &str) -> Result<(String, String), String> {
    let (k, v) = text
        .split_once('=')
        .ok_or_else(|| format!("'{text}': expected key=value"))?;
    if k.trim().is_empty() {
        return Err(format!("'{text}': empty key"));
    }
    Ok((k.trim().to_owned(), v.trim().to_owned()))
}

impl XdsArgs {
    /// The client's options, when rules come from xDS. The error names a
    /// bad address.
    pub(crate) fn options(&self, load_options: LoadOptions) -> Result<Option<XdsOptions>, String> {
        let Some(url) = &self.rules_xds else {
            return Ok(None);
        };
        let (tls, addr) = match url.split_once("://") {
            Some(("https", addr)) => (true, addr),
            Some(("http", addr)) => (false, addr),
            Some((scheme, _)) => {
                return Err(format!(
                    "--rules-xds {url}: scheme {scheme} (use http or https)"
                ));
            }
            None => (false, url.as_str()),
        };
        let addr = addr.trim_end_matches('/');
        if addr
            .rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            return Err(format!("--rules-xds {url}: expected host:port"));
        }
        let tls_files = self.xds_ca.is_some()
            || self.xds_client_cert.is_some()
            || self.xds_server_name.is_some();
        if tls_files && !tls {
            return Err(format!(
                "--rules-xds {url} is plaintext but xDS TLS settings are given; use https://"
            ));
        }
        Ok(Some(XdsOptions {
            addr: addr.to_owned(),
            tls: tls.then(|| XdsTls {
                ca: self.xds_ca.clone(),
                client_cert: self
                    .xds_client_cert
                    .clone()
                    .zip(self.xds_client_key.clone()),
                server_name: self.xds_server_name.clone(),
            }),
            node_id: self.xds_node_id.clone(),
            node_metadata: self.xds_node_metadata.clone(),
            headers: self.xds_headers.clone(),
            connect_retry: self.xds_connect_retry,
            backoff: Backoff {
                initial: self.xds_backoff_initial,
                max: self.xds_backoff_max.max(self.xds_backoff_initial),
                random_factor: self.xds_backoff_random_factor,
            },
            max_message_bytes: self.xds_max_message_bytes,
            ready_without_rules: self.xds_wait_for_rules == OnOff::Off,
            keepalive: self.xds_keepalive,
            keepalive_timeout: self.xds_keepalive_timeout,
            open_timeout: self.xds_open_timeout,
            load_options,
        }))
    }
}
