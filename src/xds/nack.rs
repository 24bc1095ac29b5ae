//! What a refused push (a NACK) carries and logs: the first errors and how
//! many more there are, a few KB whatever the push (a control plane's own
//! receive limit, grpc-go's 4 MiB, must never be what a refused push runs
//! into); and an identical NACK logged once per interval, as a control plane
//! may re-send the same push after every NACK.

use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// The most errors a NACK carries (the rest are counted), and its most bytes.
const NACK_ERRORS: usize = 20;
const NACK_BYTES: usize = 8 * 1024;
/// An identical NACK is logged again at most this often.
const NACK_LOG_EVERY: Duration = Duration::from_secs(60);

/// The NACKs of a client: the last one logged.
#[derive(Debug, Default)]
pub(super) struct Nacks {
    /// Its errors' hash, when, and how many identical NACKs were not logged
    /// since.
    last: Option<(u64, Instant, u64)>,
}

impl Nacks {
    /// A push of `version` refused with `errors` (one per line): what the
    /// NACK carries; logged unless an identical NACK was logged within the
    /// interval.
    pub(super) fn refused(&mut self, errors: &str, version: &str) -> String {
        let message = bounded(errors);
        let hash = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            message.hash(&mut h);
            h.finish()
        };
        match &mut self.last {
            Some((last, at, repeated)) if *last == hash && at.elapsed() < NACK_LOG_EVERY => {
                *repeated += 1;
            }
            last => {
                // Identical NACKs not logged since the last line.
                let suppressed = last.map_or(0, |(_, _, r)| r);
                tracing::error!(
                    version = %crate::rules::printable(version),
                    errors = %message,
                    suppressed,
                    "rules from xDS refused (NACK); the rules in force stay"
                );
                *last = Some((hash, Instant::now(), 0));
            }
        }
        message
    }
}

/// `errors` (one per line) as a NACK carries them: the first
/// [`NACK_ERRORS`], within [`NACK_BYTES`], then how many more there are.
fn bounded(errors: &str) -> String {
    let total = errors.lines().count();
    let mut out = String::new();
    let mut shown = 0;
    for line in errors.lines().take(NACK_ERRORS) {
        let room = NACK_BYTES.saturating_sub(out.len() + 64);
        if room == 0 {
            break;
        }
        let mut end = line.len().min(room);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        out.push_str(&line[..end]);
        if end < line.len() {
            out.push_str(" ...");
        }
        out.push('\n');
        shown += 1;
    }
    if total > shown {
        out.push_str(&format!("... and {} more errors\n", total - shown));
    }
    out
}
