//! Hot reload: the rules path is polled for changes (content, so a
//! Kubernetes ConfigMap's atomic `..data` symlink swap is seen once, and
//! editors' save dances settle), and SIGHUP forces a reload. A change is
//! loaded only once two checks in a row saw the same content, so a file
//! being rewritten in place is not loaded half-written (a truncated file
//! can still be valid YAML, with its last rules missing). Replacing files by
//! rename is atomic and recommended all the same. A new rule set
//! is validated as a whole and swapped in atomically; requests in flight
//! finish on the old set. An invalid change keeps the rules in force, logs
//! every error with its file and line, and counts it.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::limiter::Limiter;
use crate::rules::{LoadOptions, RuleErrors, load_paths, rule_files};

/// Reloads the limiter's rules from their paths.
#[derive(Debug)]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct Reloader {
    paths: Vec<PathBuf>,
    options: LoadOptions,
    limiter: Arc<Limiter>,
    /// Fingerprint of the files last seen (loaded or refused).
    seen: Mutex<u64>,
    /// A changed fingerprint seen once, waiting for a second look.
    settling: Mutex<Option<u64>>,
}

impl Reloader {
    /// A reloader for `limiter`, whose rules were just loaded from `paths`.
    #[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
    pub fn new(paths: Vec<PathBuf>, options: LoadOptions, limiter: Arc<Limiter>) -> Self {
        let reloader = Self {
            paths,
            options,
            limiter,
            seen: Mutex::new(0),
            settling: Mutex::new(None),
        };
        *reloader.seen.lock() = reloader.fingerprint();
        reloader.limiter.count_load(true);
        reloader
    }

    /// A hash of every rule file's name and content.
    fn fingerprint(&self) -> u64 {
        let (files, errors) = rule_files(&self.paths);
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        for file in files {
            hasher.update(file.as_os_str().as_encoded_bytes());
            match std::fs::read(&file) {
                Ok(bytes) => hasher.update(&bytes),
                Err(e) => hasher.update(e.to_string().as_bytes()),
            }
        }
        hasher.update(&(errors.len() as u64).to_le_bytes());
        hasher.digest()
    }

    /// Loads the rules now. On success they replace the rules in force; on
    /// failure the rules in force stay and the errors are returned.
    pub(crate) fn reload(&self, why: &str) -> Result<(), RuleErrors> {
        *self.seen.lock() = self.fingerprint();
        match load_paths(&self.paths, &self.options) {
            Ok(rules) => {
                tracing::info!(
                    why,
                    paths = ?self.paths,
                    rules = rules.rules().len(),
                    domains = rules.domain_count(),
                    "rules reloaded"
                );
                self.limiter.set_rules(rules);
                Ok(())
            }
            Err(errors) => {
                self.limiter.count_load(false);
                for e in &errors.0 {
                    tracing::error!(why, paths = ?self.paths, error = %e, "rules not reloaded; the rules in force stay");
                }
                Err(errors)
            }
        }
    }

    /// Looks at the files once: reloads when they changed and read the same
    /// at the previous look. Returns whether a reload was attempted. Reads
    /// every rule file: the server calls it on a blocking thread every
    /// `--watch-interval`.
    #[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
    pub fn poll(&self) -> bool {
        let now = self.fingerprint();
        if !settled(&self.settling, *self.seen.lock(), now) {
            return false;
        }
        let _ = self.reload("rule files changed");
        true
    }
}

/// Whether a watched file whose contents hash to `now` (`seen` when last
/// loaded) changed and read the same at the previous look (kept in
/// `settling`), so a file being rewritten is not loaded half-written.
pub(crate) fn settled(settling: &Mutex<Option<u64>>, seen: u64, now: u64) -> bool {
    let mut settling = settling.lock();
    if now == seen {
        *settling = None;
        return false;
    }
    if *settling != Some(now) {
        *settling = Some(now);
        return false;
    }
    *settling = None;
    true
}
