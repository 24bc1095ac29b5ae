//! The write-behind: a thread that, every flush interval (and at once when
//! a reset asks), copies each shard out under its lock (40 bytes a key, a
//! few microseconds a shard), cuts it into chunks, and writes only the
//! chunks whose checksum changed, with the chunks that emptied deleted, in
//! one transaction. Decisions never wait for it: they only ever take a
//! shard's lock, which the copy holds for as long as a decision would.
//!
//! A key whose state no longer matters is left out of the copy, so its
//! chunk is rewritten without it: the file follows the live keys, and is
//! compacted when it holds much more free space than data.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::codec;
use super::file::File;
use crate::clock::{NANOS_PER_SEC, Nanos};
use crate::store::memory::{MemoryStore, Persistence, ShardCopy};

/// Chunks per shard: 16 of table counters (by four bits of the hash that
/// the shard does not use), one of keyed counters, sliding logs and held request IDs. With a
/// million keys a chunk is about 10 KB, and a busy key rewrites only its own.
const CHUNKS_PER_SHARD: usize = 17;

/// What a flush reports: keys written, and the file's size.
pub(super) type Flushed = (u64, u64);

/// The writer's state between flushes.
pub(super) struct Writer {
    /// `None` after a failed write: reopened (and re-read) at the next.
    file: Option<File>,
    path: PathBuf,
    /// Each chunk's checksum as the file holds it.
    written: HashMap<u32, u64>,
    copy: ShardCopy,
    chunks: Vec<ShardCopy>,
    bytes: Vec<u8>,
}

impl Writer {
    /// A writer of `file` at `path`, which holds chunks with `written` checksums.
    pub(super) fn new(file: File, path: PathBuf, written: HashMap<u32, u64>) -> Self {
        Self {
            file: Some(file),
            path,
            written,
            copy: ShardCopy::default(),
            chunks: (0..CHUNKS_PER_SHARD)
                .map(|_| ShardCopy::default())
                .collect(),
            bytes: Vec::new(),
        }
    }

    /// Writes what changed in `store` since the last flush, leaving out
    /// what no longer matters at `now_secs`.
    pub(super) fn flush(&mut self, store: &MemoryStore, now_secs: u32) -> Result<Flushed, String> {
        if self.file.is_none() {
            let file = File::open(&self.path).map_err(|e| e.to_string())?;
            self.written = file.checksums()?;
            self.file = Some(file);
        }
        let shards = store.shard_count();
        let bits = shards.trailing_zeros();
        let mut sums = self.written.clone();
        let (mut puts, mut deletes) = (Vec::new(), Vec::new());
        let (mut keys, mut live) = (0u64, 0u64);
        for shard in 0..shards {
            store.copy_shard(shard, now_secs, &mut self.copy);
            keys += self.copy.len() as u64;
            for chunk in &mut self.chunks {
                chunk.clear();
            }
            for c in self.copy.counters.drain(..) {
                let sub = ((c.hash >> 32) >> bits) as usize & 15;
                self.chunks[sub].counters.push(c);
            }
            let extra = &mut self.chunks[16];
            std::mem::swap(&mut extra.overflow, &mut self.copy.overflow);
            std::mem::swap(&mut extra.logs, &mut self.copy.logs);
            std::mem::swap(&mut extra.held, &mut self.copy.held);
            for (sub, chunk) in self.chunks.iter_mut().enumerate() {
                // The same keys give the same bytes, whatever the table's order.
                chunk.counters.sort_unstable_by_key(|c| (c.hash, c.check));
                chunk.overflow.sort_unstable_by(|a, b| a.key.cmp(&b.key));
                chunk.logs.sort_unstable_by(|a, b| a.key.cmp(&b.key));
                chunk.held.sort_unstable_by(|a, b| a.key.cmp(&b.key));
                let id = (shard * CHUNKS_PER_SHARD + sub) as u32;
                match codec::encode(chunk, &mut self.bytes) {
                    None => {
                        if sums.remove(&id).is_some() {
                            deletes.push(id);
                        }
                    }
                    Some(sum) => {
                        live += self.bytes.len() as u64;
                        if sums.insert(id, sum) != Some(sum) {
                            puts.push((id, self.bytes.clone()));
                        }
                    }
                }
            }
        }
        // Chunks of another layout (a store of another shard count wrote them).
        let layout = (shards * CHUNKS_PER_SHARD) as u32;
        sums.retain(|id, _| {
            let stray = *id >= layout;
            if stray {
                deletes.push(*id);
            }
            !stray
        });
        let Some(file) = self.file.as_mut() else {
            return Err("the data file is not open".into());
        };
        if !puts.is_empty() || !deletes.is_empty() {
            if let Err(e) = file.write(&puts, &deletes, &sums) {
                self.file = None;
                return Err(e);
            }
            self.written = sums;
        }
        if let Err(e) = file.compact(live, false) {
            tracing::debug!(error = %e, "the data file was not compacted");
            self.file = None;
        }
        let len = self.file.as_ref().map_or(0, File::len);
        Ok((keys, len))
    }

    /// After the last flush: the file gives back all its free space.
    fn compact_all(&mut self) {
        if let Some(file) = self.file.as_mut()
            && let Err(e) = file.compact(0, true)
        {
            tracing::warn!(error = %e, "the data file was not compacted at stop");
        }
    }
}

/// Runs `writer` on a thread of its own for the store `store_of` finds in
/// `owner`, and hands `persistence` the way to stop it (a last flush).
pub(super) fn spawn<O: Send + Sync + 'static>(
    mut writer: Writer,
    owner: Arc<O>,
    store_of: fn(&O) -> Option<&MemoryStore>,
    now_of: fn(&O) -> Nanos,
    interval: Duration,
    persistence: Arc<Persistence>,
    claim: impl Send + 'static,
) -> std::io::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let shared = persistence.clone();
    let thread = std::thread::Builder::new()
        .name("tollgate-data".into())
        .spawn(move || {
            // The directory stays claimed until the last flush has ended.
            let _claim = claim;
            let mut served = 0;
            let mut next = Instant::now() + interval;
            loop {
                let stop = stopping.load(Ordering::SeqCst);
                let asked = shared.requested();
                let now = Instant::now();
                if !stop && now < next && asked <= served {
                    std::thread::park_timeout(next - now);
                    continue;
                }
                let Some(store) = store_of(&owner) else {
                    return Ok(());
                };
                let now_secs = (now_of(&owner) / NANOS_PER_SEC) as u32;
                let started = Instant::now();
                let result = writer.flush(store, now_secs);
                report(&shared, &result, started.elapsed(), &writer.path);
                shared.flush_ended(asked, result.clone());
                served = asked;
                next = Instant::now() + interval;
                if stop {
                    return match result {
                        Ok((keys, _)) => {
                            writer.compact_all();
                            tracing::info!(keys, path = %writer.path.display(), "counters written to the data directory");
                            Ok(())
                        }
                        Err(e) => Err(format!(
                            "the counts since the last flush were not written to {}: {e}",
                            writer.path.display()
                        )),
                    };
                }
            }
        })?;
    let handle = thread.thread().clone();
    persistence.attach(
        handle,
        Box::new(move || {
            stop.store(true, Ordering::SeqCst);
            thread.thread().unpark();
            thread
                .join()
                .unwrap_or_else(|_| Err("the data directory's writer stopped on a panic".into()))
        }),
    );
    Ok(())
}

/// Logs the turns: writes failing (once, not every second) and writing again.
fn report(
    p: &Persistence,
    result: &Result<Flushed, String>,
    took: Duration,
    path: &std::path::Path,
) {
    let was_failing = p.failing().is_some();
    match result {
        Ok((keys, bytes)) => {
            if was_failing {
                tracing::warn!(path = %path.display(), keys, "the data directory is written again");
            }
            tracing::debug!(keys, bytes, took = ?took, "data directory flushed");
        }
        Err(e) if !was_failing => tracing::error!(
            path = %path.display(),
            error = %e,
            "cannot write the data directory: counters are kept in memory and decisions go on; retrying every flush interval (a crash now loses the counts since the last write)"
        ),
        Err(_) => {}
    }
}
