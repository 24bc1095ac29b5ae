//! The memory store's counters kept in a data directory (`--data-dir`),
//! so a restart continues them. Decisions stay in memory; a writer thread
//! writes behind them (`writer.rs`), every flush interval, in one redb
//! transaction (`file.rs`) of checksummed chunks (`codec.rs`). The
//! directory belongs to one process (`owner.rs`).
//!
//! The table keeps only hashes of the keys, so the hash seed is kept in the
//! file with them and the restored store hashes with it: a request after
//! the restart finds its counter where it left it.

mod codec;
mod file;
mod owner;
mod writer;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::{NANOS_PER_SEC, Nanos};
use crate::store::memory::{MemoryStore, MemoryStoreOptions, Persistence, ShardCopy};
use file::{FILE_NAME, FORMAT, File, Refused};

/// Where and how often the counters are written.
#[derive(Debug, Clone)]
pub(crate) struct DataOptions {
    /// The directory (`--data-dir`).
    pub dir: PathBuf,
    /// How often what changed is written (`--data-flush-interval`): what a
    /// crash may lose.
    pub flush_interval: Duration,
    /// Discard the directory's counters and start afresh (`--data-reset`).
    pub reset: bool,
}

/// A data directory read and claimed, its writer not yet started.
pub(crate) struct Opened {
    writer: writer::Writer,
    owner: owner::Owner,
    persistence: Arc<Persistence>,
    interval: Duration,
}

/// The memory store with the counters `options.dir` keeps, those whose
/// owner `keep` still knows (see [`crate::store::scope_tag`]) and that
/// still matter at `now`. The error names the flag, the file and what to do.
pub(crate) fn open(
    options: &DataOptions,
    memory: MemoryStoreOptions,
    keep: &dyn Fn(u64) -> bool,
    now: Nanos,
) -> Result<(MemoryStore, Opened), String> {
    let started = Instant::now();
    let owner = owner::claim(&options.dir)?;
    let path = options.dir.join(FILE_NAME);
    if options.reset {
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::warn!(path = %path.display(), "--data-reset: the saved counters are discarded; every counter starts afresh")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(format!(
                    "--data-reset: cannot remove {}: {e}",
                    path.display()
                ));
            }
        }
    }
    let seed =
        std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u64);
    let (file, contents) =
        File::open_or_create(&options.dir, seed).map_err(|r| refusal(&path, &r))?;
    let persistence = Arc::new(Persistence::default());
    let store = MemoryStore::durable(memory, contents.seed, persistence.clone());
    let now_secs = (now / NANOS_PER_SEC) as u32;
    let (mut restored, mut gone, mut expired) = (0usize, 0usize, 0usize);
    let mut written = HashMap::new();
    let mut copy = ShardCopy::default();
    for (id, bytes) in contents.chunks {
        copy.clear();
        codec::decode(&bytes, &mut copy)
            .map_err(|why| refusal(&path, &Refused::Damaged(format!("chunk {id}: {why}"))))?;
        written.insert(id, codec::checksum(&bytes).unwrap_or(0));
        let before = copy.len();
        let live = |expires: u32| expires > now_secs;
        copy.counters.retain(|c| live(c.expires));
        copy.overflow.retain(|c| live(c.expires));
        copy.logs.retain(|c| live(c.expires));
        copy.held.retain(|c| live(c.expires));
        expired += before - copy.len();
        let before = copy.len();
        copy.counters.retain(|c| keep(c.scope));
        copy.overflow.retain(|c| keep(c.scope));
        copy.logs.retain(|c| keep(c.scope));
        copy.held.retain(|c| keep(c.scope));
        gone += before - copy.len();
        restored += store.restore(std::mem::take(&mut copy));
    }
    tracing::info!(
        path = %path.display(),
        keys = restored,
        expired,
        rules_gone = gone,
        took = ?started.elapsed(),
        "counters restored from the data directory"
    );
    let opened = Opened {
        writer: writer::Writer::new(file, path, written),
        owner,
        persistence,
        interval: options.flush_interval,
    };
    Ok((store, opened))
}

impl Opened {
    /// Starts writing behind the store that `store_of` finds in `owner`
    /// (the one [`open`] made), at the time `now_of` reads. The store's
    /// [`Persistence::close`] stops it with a last flush.
    pub(crate) fn start<O: Send + Sync + 'static>(
        self,
        owner: Arc<O>,
        store_of: fn(&O) -> Option<&MemoryStore>,
        now_of: fn(&O) -> Nanos,
    ) -> Result<(), String> {
        writer::spawn(
            self.writer,
            owner,
            store_of,
            now_of,
            self.interval,
            self.persistence,
            self.owner,
        )
        .map_err(|e| format!("--data-dir: cannot start its writer: {e}"))
    }
}

/// Why a file is refused, and what to do about it.
fn refusal(path: &std::path::Path, refused: &Refused) -> String {
    let path = path.display();
    match refused {
        Refused::Damaged(why) => format!(
            "{path} cannot be read: {why}. Tollgate does not start from nothing unless told: \
             restore the file, or start once with --data-reset (TOLLGATE_DATA_RESET=true) to \
             discard its counters (every counter starts afresh)"
        ),
        Refused::Format(0) => format!(
            "{path} is in another data format than this Tollgate's ({FORMAT}): run the Tollgate \
             that wrote it, or start once with --data-reset to discard its counters"
        ),
        Refused::Format(v) => format!(
            "{path} is in data format {v}, this Tollgate reads format {FORMAT}: run the Tollgate \
             that wrote it, or start once with --data-reset to discard its counters"
        ),
        Refused::Io(why) => format!("--data-dir: cannot open {path}: {why}"),
    }
}
