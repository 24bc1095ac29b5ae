//! Tollgate as the reference's binary: `ratelimit` with no arguments takes
//! the reference's defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::settings::{AlgorithmArg, OnOff, ServeArgs};

/// The program name under which Tollgate behaves as the reference's
/// binary (Envoy Gateway runs `/bin/ratelimit` with no arguments).
pub(crate) const REFERENCE_PROGRAM: &str = "ratelimit";

impl ServeArgs {
    /// Puts the reference's defaults in place of Tollgate's for every
    /// setting whose flag `explicit(id)` says was not given: what
    /// `ratelimit` with no arguments does before reading the reference's
    /// variables. gRPC on 0.0.0.0:8081, HTTP on 0.0.0.0:8080 and
    /// 0.0.0.0:6070, rules under /srv/runtime_data/current/config, log level
    /// warn, fixed windows (the reference's only algorithm), no rate limit
    /// headers, TLS (when set) on gRPC only.
    pub(crate) fn reference_defaults(&mut self, explicit: &dyn Fn(&str) -> bool) {
        let all = [0, 0, 0, 0];
        if !explicit("grpc_addr") {
            self.grpc_addr = SocketAddr::from((all, 8081));
        }
        if !explicit("admin_addr") {
            self.admin_addr = vec![SocketAddr::from((all, 8080)), SocketAddr::from((all, 6070))];
        }
        if !explicit("rules") {
            self.rules = vec![PathBuf::from("/srv/runtime_data/current/config")];
        }
        if !explicit("log_level") {
            self.log_level = "warn".into();
        }
        if !explicit("default_algorithm") {
            self.rule_load.default_algorithm = AlgorithmArg::FixedWindow;
        }
        if !explicit("response_headers") {
            self.response_headers = OnOff::Off;
        }
        if !explicit("admin_tls") {
            self.admin_tls = OnOff::Off;
        }
    }
}
