//! What the memory store and the writer of its data directory share
//! (`store::durable`): a reset asks for a flush and waits for it, so a
//! reset counter cannot come back after a crash; the writer reports how its
//! writes go, for the health endpoint, `/metrics` and the final flush.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

/// The most a reset waits for its flush (a writer that cannot write says
/// so in the log and the health endpoint; the reset itself is done).
const FLUSH_WAIT: Duration = Duration::from_secs(10);

/// Stops the writer after a last flush; its error says what was not written.
type Closer = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// The handle a durable memory store and its writer share.
pub struct Persistence {
    /// Flushes asked for (by resets); the writer serves them at once.
    requested: AtomicU64,
    /// The last request the writer has served (written, or failed).
    served: tokio::sync::watch::Sender<u64>,
    /// The writer's thread, woken for a request.
    writer: Mutex<Option<std::thread::Thread>>,
    /// How the writer is stopped.
    closer: Mutex<Option<Closer>>,
    /// Why writes fail now (`None`: they succeed).
    failing: Mutex<Option<String>>,
    flushes: AtomicU64,
    failures: AtomicU64,
    keys: AtomicU64,
    bytes: AtomicU64,
}

impl std::fmt::Debug for Persistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persistence")
            .field("events", &self.events())
            .finish_non_exhaustive()
    }
}

impl Default for Persistence {
    fn default() -> Self {
        Self {
            requested: AtomicU64::new(0),
            served: tokio::sync::watch::Sender::new(0),
            writer: Mutex::new(None),
            closer: Mutex::new(None),
            failing: Mutex::new(None),
            flushes: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            keys: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }
}

/// How the writes of a data directory go, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataEvents {
    /// Flushes written.
    pub flushes: u64,
    /// Flushes that failed (a full disk, an I/O error).
    pub failures: u64,
    /// Whether the last flush failed.
    pub failing: bool,
    /// Keys in the directory after the last flush written.
    pub keys: u64,
    /// The size of the directory's database file, in bytes.
    pub bytes: u64,
}

impl Persistence {
    /// The writer runs on `thread` and is stopped by `closer`.
    pub fn attach(&self, thread: std::thread::Thread, closer: Closer) {
        *self.writer.lock() = Some(thread);
        *self.closer.lock() = Some(closer);
    }

    /// Asks the writer for a flush now and waits until one that began after
    /// this call has ended (at most [`FLUSH_WAIT`]). `false` if it failed
    /// or did not end in time.
    pub async fn flushed(&self) -> bool {
        let wanted = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(thread) = self.writer.lock().as_ref() {
            thread.unpark();
        }
        let mut served = self.served.subscribe();
        let waited = tokio::time::timeout(FLUSH_WAIT, served.wait_for(|s| *s >= wanted)).await;
        matches!(waited, Ok(Ok(_))) && self.failing.lock().is_none()
    }

    /// The writer: the requests a flush starting now serves.
    pub fn requested(&self) -> u64 {
        self.requested.load(Ordering::SeqCst)
    }

    /// The writer: a flush that served `requested` has ended, written
    /// (`keys` in a file of `bytes`) or failed (why).
    pub fn flush_ended(&self, requested: u64, result: Result<(u64, u64), String>) {
        match result {
            Ok((keys, bytes)) => {
                self.flushes.fetch_add(1, Ordering::Relaxed);
                self.keys.store(keys, Ordering::Relaxed);
                self.bytes.store(bytes, Ordering::Relaxed);
                *self.failing.lock() = None;
            }
            Err(why) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                *self.failing.lock() = Some(why);
            }
        }
        self.served.send_if_modified(|s| {
            let newer = requested > *s;
            *s = (*s).max(requested);
            newer
        });
    }

    /// Why the writes of the data directory fail now, if they do.
    pub fn failing(&self) -> Option<String> {
        self.failing.lock().clone()
    }

    /// The writes so far.
    pub fn events(&self) -> DataEvents {
        DataEvents {
            flushes: self.flushes.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            failing: self.failing.lock().is_some(),
            keys: self.keys.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }

    /// Stops the writer after a last flush of everything (decisions have
    /// stopped); the error says what could not be written. Once: later
    /// calls do nothing.
    pub fn close(&self) -> Result<(), String> {
        let closer = self.closer.lock().take();
        closer.map_or(Ok(()), |close| close())
    }
}
