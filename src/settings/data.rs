//! `serve`'s data directory: the memory store's counters kept on disk, so
//! a restart continues them (see `store::durable`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::values::parse_duration;
use crate::store::durable::DataOptions;

/// The data directory's flags.
#[derive(Debug, Args, Clone)]
pub(crate) struct DataArgs {
    /// Keep the memory store's counters in this directory (created if
    /// missing; one process each): a restart on it continues every counter.
    /// About 40 bytes on disk per live key, written behind the decisions.
    /// Not with a Redis store, which keeps its own.
    #[arg(long = "data-dir", env = "TOLLGATE_DATA_DIR", value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// With --data-dir: how often what changed is written. A crash (kill -9,
    /// power loss) loses at most this much of the counts; a clean stop
    /// loses nothing. Each write is one transaction and an fsync, and
    /// rewrites the chunks (about 10 KB each) holding a changed key.
    #[arg(long = "data-flush-interval", env = "TOLLGATE_DATA_FLUSH_INTERVAL", default_value = "1s", value_parser = parse_flush_interval)]
    pub flush_interval: Duration,

    /// With --data-dir: discard the directory's saved counters and start
    /// afresh (every counter restarts). A damaged or foreign file is
    /// otherwise refused; give this once, not in a permanent configuration.
    #[arg(long = "data-reset", env = "TOLLGATE_DATA_RESET", requires = "dir")]
    pub reset: bool,
}

fn parse_flush_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < Duration::from_millis(10) || interval > Duration::from_secs(3600) {
        return Err(format!("'{text}': between 10ms and 60m"));
    }
    Ok(interval)
}

impl DataArgs {
    /// The data directory's options, when one is given.
    pub(crate) fn options(&self) -> Option<DataOptions> {
        self.dir.as_ref().map(|dir| DataOptions {
            dir: dir.clone(),
            flush_interval: self.flush_interval,
            reset: self.reset,
        })
    }
}
