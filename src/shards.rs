//! State written on the hot path by every worker and read rarely: one
//! shard per thread, each behind its own lock, merged by whoever reads.
//!
//! The workers are threads with their own runtimes (see `server`); a single
//! lock taken on every decided request would make them queue on each other.
//! Here a thread always takes the same shard, so its lock is uncontended
//! except while a reader (a scrape, an admin page) walks the shards.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};

/// The shard a thread uses, given out in the order threads first ask.
fn thread_slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SLOT.with(|slot| *slot)
}

/// One shard, on a cache line of its own so that two workers' writes do not
/// invalidate each other's line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(Mutex<T>);

/// A `T` per thread (threads beyond the shard count share, still correct:
/// each shard has its lock), merged on read.
#[derive(Debug)]
pub(crate) struct PerThread<T> {
    shards: Box<[Padded<T>]>,
}

impl<T: Default> PerThread<T> {
    /// Shards for every thread the machine runs at once, twice over (the
    /// workers, the control runtime and blocking threads share the rest):
    /// at least 4, at most 64.
    pub(crate) fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        Self::with_shards((threads * 2).clamp(4, 64))
    }

    /// `count` shards (at least one).
    pub(crate) fn with_shards(count: usize) -> Self {
        Self {
            shards: (0..count.max(1)).map(|_| Padded::default()).collect(),
        }
    }
}

impl<T> PerThread<T> {
    /// How many shards there are.
    pub(crate) fn len(&self) -> usize {
        self.shards.len()
    }

    /// This thread's shard, locked.
    pub(crate) fn mine(&self) -> MutexGuard<'_, T> {
        self.shards[thread_slot() % self.shards.len()].0.lock()
    }

    /// Every shard in turn, each locked only while `f` reads it.
    pub(crate) fn each(&self, mut f: impl FnMut(&T)) {
        for shard in &*self.shards {
            f(&shard.0.lock());
        }
    }

    /// Every shard in turn, each locked only while `f` changes it.
    pub(crate) fn each_mut(&self, mut f: impl FnMut(&mut T)) {
        for shard in &*self.shards {
            f(&mut shard.0.lock());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_writes_its_own_shard_and_a_reader_sees_them_all() {
        let counts: std::sync::Arc<PerThread<u64>> = std::sync::Arc::new(PerThread::with_shards(8));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let counts = counts.clone();
                std::thread::spawn(move || {
                    for _ in 0..1_000 {
                        *counts.mine() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let mut total = 0;
        let mut used = 0;
        counts.each(|c| {
            total += *c;
            used += usize::from(*c > 0);
        });
        assert_eq!(total, 4_000);
        assert!(used >= 2, "threads spread over shards: {used}");
    }

    #[test]
    fn more_threads_than_shards_share_and_lose_nothing() {
        let counts: std::sync::Arc<PerThread<u64>> = std::sync::Arc::new(PerThread::with_shards(1));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let counts = counts.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *counts.mine() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        let mut total = 0;
        counts.each(|c| total += *c);
        assert_eq!(total, 40_000);
    }
}
