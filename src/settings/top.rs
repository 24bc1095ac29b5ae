//! `tollgate top`'s flags.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::parse_duration;

/// `tollgate top`.
#[derive(Debug, Args, Clone)]
pub(crate) struct TopArgs {
    /// The admin port of a running Tollgate (`http://HOST:PORT`, or
    /// `https://HOST:PORT` for one with --admin-tls on).
    #[arg(long, default_value = "http://127.0.0.1:6070")]
    pub admin: String,
    /// How often to refresh (at least 100ms: each refresh is a request to
    /// the admin port).
    #[arg(long, default_value = "2s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Only this domain's rules.
    #[arg(long)]
    pub domain: Option<String>,
    /// Only clients with a descriptor key or value containing this.
    #[arg(long)]
    pub search: Option<String>,
    /// Whose view: `instance` (the one at --admin) or `merged` (every
    /// instance sharing its Redis, from their published views).
    #[arg(long, default_value = "instance", value_parser = ["instance", "merged"])]
    pub scope: String,
    /// Print once and exit.
    #[arg(long)]
    pub once: bool,
    /// A file whose first token (`TOKEN` or `NAME:TOKEN`) is sent as a
    /// bearer token (for a Tollgate with --admin-reads token).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// CA certificates (PEM) that an `https://` admin port's certificate
    /// must chain to (without it: the system's roots).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
}

impl TopArgs {
    /// What to run; the error names an unreadable token file.
    pub(crate) fn options(&self) -> Result<crate::top::TopOptions, String> {
        let token = match &self.token_file {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--token-file {}: {e}", path.display()))?;
                let tokens = crate::admin::parse_tokens(&text)
                    .map_err(|e| format!("--token-file {}: {e}", path.display()))?;
                tokens.into_iter().map(|t| t.secret).next()
            }
        };
        Ok(crate::top::TopOptions {
            admin: self.admin.clone(),
            interval: self.interval,
            domain: self.domain.clone(),
            search: self.search.clone(),
            merged: self.scope == "merged",
            once: self.once,
            token,
            ca_file: self.ca_file.clone(),
        })
    }
}

/// A refresh interval: a duration of at least 100 ms, so `top` cannot
/// hammer the admin port it watches.
fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < Duration::from_millis(100) {
        return Err(format!("'{text}' is below 100ms"));
    }
    Ok(interval)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_refresh_interval_is_at_least_100ms() {
        assert_eq!(
            super::parse_interval("1us"),
            Err("'1us' is below 100ms".to_owned())
        );
        assert!(super::parse_interval("100ms").is_ok());
    }
}
